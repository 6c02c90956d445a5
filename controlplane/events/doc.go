// Package events connects the session event log in PostgreSQL to everything
// that reads it live: streams (SSE) on any control-plane node, and the agent
// loop.
//
// Appends commit with a NOTIFY on store.EventsChannel carrying the session
// and its last sequence number; live previews (event_start, event_delta) go
// out on store.DeltasChannel and are never stored. Each node keeps one
// listening connection (Hub) and wakes the subscribers of a session, which
// then read the new events by sequence number from the database. So a
// subscriber on any node sees every event exactly once and in order, and a
// lost notification only delays delivery until the next one (or the
// keep-alive tick, which re-reads). The Hub also hears store.WorkChannel,
// work queued in a self-hosted environment, and hands it to the store,
// which wakes this node's long polls of that queue.
//
//	runner ─Append─▶ PostgreSQL ─NOTIFY─▶ Hub (every node) ─▶ Subscription ─▶ SSE
//	                     ▲                                         │
//	                     └──────────── read events after seq ◀─────┘
package events
