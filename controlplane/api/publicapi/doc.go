// Package publicapi serves corral's public REST API under /v1/, wire
// compatible with the Claude Managed Agents API so that the official
// Anthropic SDKs work against corral by changing only the base URL: agents
// (with immutable versions), environments and sessions.
//
//	request ─▶ tenant (Default until auth exists) ─▶ handler: read capped body,
//	           decode strictly, validate, apply through store ─▶ JSON | error envelope
//
// Requests are decoded member by member so that an omitted field, null and a
// value mean different things (update and patch semantics). Every error is
// an errdefs kind written by api.WriteError, the one translation to HTTP.
// Page cursors are opaque: base64url JSON naming the list they belong to,
// its order and the (created_at, id) position.
package publicapi
