package events

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"corral.dev/corral/controlplane/store"
)

// maxPendingDeltas bounds the previews queued for one slow subscriber;
// beyond it previews are dropped (they are best effort), never events.
const maxPendingDeltas = 1024

// Hub fans notifications out to this node's subscribers.
type Hub struct {
	st  *store.Store
	log *slog.Logger

	mu sync.Mutex
	// subs guarded by mu: subscribers by session id.
	subs map[string]map[*Subscription]struct{}
	// latest guarded by mu: the highest sequence number announced per
	// session with subscribers.
	latest map[string]int64
}

// NewHub returns a hub; call Run to start listening.
func NewHub(st *store.Store, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{st: st, log: log, subs: map[string]map[*Subscription]struct{}{}, latest: map[string]int64{}}
}

// Run listens until ctx ends, reconnecting after failures. ready is closed
// once the first LISTEN is in place.
func (h *Hub) Run(ctx context.Context, ready chan<- struct{}) {
	first := true
	for ctx.Err() == nil {
		err := h.st.Listen(ctx, []string{store.EventsChannel, store.DeltasChannel, store.WorkChannel}, func() {
			if first {
				close(ready)
				first = false
			} else {
				h.wakeAll() // notifications may have been missed while reconnecting
			}
		}, h.dispatch)
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("event listener failed; reconnecting", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (h *Hub) dispatch(channel, payload string) {
	switch channel {
	case store.WorkChannel:
		// Work was queued in a self-hosted environment: wake its polls.
		h.st.WorkNotified(payload)
	case store.EventsChannel:
		sid, rest, ok := strings.Cut(payload, ":")
		if !ok {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		subs := h.subs[sid]
		if len(subs) == 0 {
			return
		}
		if rest == "deleted" {
			for s := range subs {
				s.push(func(s *Subscription) { s.deleted = true })
			}
			return
		}
		seq, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return
		}
		if seq > h.latest[sid] {
			h.latest[sid] = seq
		}
		for s := range subs {
			s.push(func(s *Subscription) {
				if seq > s.latestSeq {
					s.latestSeq = seq
				}
			})
		}
	case store.DeltasChannel:
		var d wireDelta
		if err := json.Unmarshal([]byte(payload), &d); err != nil {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		after := h.latest[d.SessionID]
		for s := range h.subs[d.SessionID] {
			if !s.wantDeltas {
				continue
			}
			s.push(func(s *Subscription) {
				if len(s.deltas) < maxPendingDeltas {
					s.deltas = append(s.deltas, Delta{AfterSeq: after, Frame: d.Frame})
				}
			})
		}
	}
}

// Appended implements store.AppendObserver: the events this node's agent
// loop just committed reach its subscribers with their announcement, so a
// stream writes them without reading them back from the database (the
// notification that follows then finds nothing new). What a subscriber
// cannot take whole (a gap, or over its bound) it reads as before.
//
// Subscribers of previews are left out, and the previews' place (latest)
// is not moved: a preview is notified before the commit of the event it
// previews, and comes after it by the same ordered channel of
// notifications; an event written at its commit would overtake it.
func (h *Hub) Appended(sessionID string, evs []store.StoredEvent) {
	if len(evs) == 0 {
		return
	}
	seq := evs[len(evs)-1].Seq
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[sessionID] {
		if s.wantDeltas {
			continue
		}
		s.push(func(s *Subscription) {
			s.addLocal(evs)
			if seq > s.latestSeq {
				s.latestSeq = seq
			}
		})
	}
}

// maxLocalBytes bounds the events held for one subscriber between its
// reads (Appended); beyond it they are dropped, and read from the store.
const maxLocalBytes = 1 << 20

// addLocal keeps evs for the reader if they follow what it holds and fit
// in its bound; else the reader reads them (and what follows them: it
// writes what it holds, then reads from there). Called with s.mu held.
func (s *Subscription) addLocal(evs []store.StoredEvent) {
	n := 0
	for _, e := range evs {
		n += len(e.JSON)
	}
	if len(s.local) > 0 && s.local[len(s.local)-1].Seq+1 != evs[0].Seq || s.localBytes+n > maxLocalBytes {
		return
	}
	s.local = append(s.local, evs...)
	s.localBytes += n
}

func (h *Hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, subs := range h.subs {
		for s := range subs {
			s.push(func(s *Subscription) { s.reread = true })
		}
	}
}

// Subscribe registers interest in a session's events (and previews, if
// wantDeltas). Close the subscription when done.
func (h *Hub) Subscribe(sessionID string, wantDeltas bool) *Subscription {
	s := &Subscription{hub: h, sessionID: sessionID, wantDeltas: wantDeltas, ready: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[sessionID] == nil {
		h.subs[sessionID] = map[*Subscription]struct{}{}
	}
	h.subs[sessionID][s] = struct{}{}
	return s
}

// Delta is a preview frame, to be written after the events up to AfterSeq.
type Delta struct {
	AfterSeq int64
	Frame    json.RawMessage
}

// Subscription is one reader's interest in a session.
type Subscription struct {
	hub        *Hub
	sessionID  string
	wantDeltas bool
	ready      chan struct{} // signalled (capacity 1) when state changed

	mu sync.Mutex
	// The fields below are guarded by mu.
	latestSeq int64
	deltas    []Delta
	deleted   bool
	reread    bool
	// local are events this node committed (Hub.Appended), in order and
	// without gaps, localBytes their JSON's size.
	local      []store.StoredEvent
	localBytes int
}

// push changes the subscription's state and signals its reader. Called
// with the hub's lock held.
func (s *Subscription) push(f func(*Subscription)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Ready is signalled when there may be something new.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Pending is what arrived since the last call: the highest announced
// sequence number, previews in arrival order, and whether the session was
// deleted or a re-read is due (after a reconnect). Local are events this
// node committed, in order without gaps, which the reader may write
// instead of reading them (those it has written already it skips).
func (s *Subscription) Pending() (latestSeq int64, deltas []Delta, deleted, reread bool, local []store.StoredEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	latestSeq, deltas, deleted, reread, local = s.latestSeq, s.deltas, s.deleted, s.reread, s.local
	s.deltas, s.reread, s.local, s.localBytes = nil, false, nil, 0
	return
}

// Close unregisters the subscription.
func (s *Subscription) Close() {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[s.sessionID], s)
	if len(h.subs[s.sessionID]) == 0 {
		delete(h.subs, s.sessionID)
		delete(h.latest, s.sessionID)
	}
}

// wireDelta is a preview on store.DeltasChannel.
type wireDelta struct {
	SessionID string          `json:"s"`
	Frame     json.RawMessage `json:"f"`
}
