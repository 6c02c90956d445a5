package publicapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// previewTypes are the event types a stream may ask previews of
// (event_deltas[]).
var previewTypes = map[string]bool{"agent.message": true, "agent.thinking": true}

// stream serves GET /v1/sessions/{id}/events/stream: Server-Sent Events,
// one frame per event with an `event: <type>` line (the Go SDK drops frames
// without one) and the event's id as the SSE id.
//
// A new stream starts with events appended after it opened (no replay, as
// the Managed Agents API behaves). A client that reconnects with
// Last-Event-ID gets every event after that one, and nothing twice.
func (h *EventsHandler) stream(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sid := r.PathValue("session_id")
	if err := workerSession(ctx, h.Store, sid); err != nil {
		h.WriteError(w, r, err)
		return
	}
	wanted := map[string]bool{}
	for _, t := range queryList(r.URL.Query(), "event_deltas") {
		if !previewTypes[t] {
			h.WriteError(w, r, errdefs.InvalidArgument("event_deltas: %q is not one of agent.message, agent.thinking", t))
			return
		}
		wanted[t] = true
	}
	// Subscribe before reading the starting point, so that nothing appended
	// in between is missed.
	sub := h.Hub.Subscribe(sid, len(wanted) > 0)
	defer sub.Close()
	st, err := h.Store.Events().LoopState(ctx, sid)
	if err != nil {
		h.WriteError(w, r, err)
		return
	}
	after := st.LastSeq
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		seq, err := h.Store.Events().SeqOf(ctx, sid, last)
		if err != nil {
			if errdefs.IsNotFound(err) {
				err = errdefs.InvalidArgument("Last-Event-ID %q does not name an event of this session", last)
			}
			h.WriteError(w, r, err)
			return
		}
		after = seq
	}

	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Connection", "keep-alive")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if h.OpenStreams != nil {
		h.OpenStreams.Inc()
		defer h.OpenStreams.Dec()
	}
	rc := http.NewResponseController(w)
	flush := func() error { return rc.Flush() }
	if err := flush(); err != nil {
		return
	}

	// local are events this node committed that arrived with their
	// announcement (events.Hub.Appended): those that continue the stream
	// are written without a read.
	var local []store.StoredEvent

	// pump writes stored events after `after`, up to upTo (0: all). Between
	// notifications it reads only up to the announced sequence number:
	// events committed since then are written when their notification
	// arrives, in order with the previews the hub interleaved. An error
	// (the client gone, the database failing) ends the stream; the client
	// resumes with Last-Event-ID.
	pump := func(upTo int64) error {
		for ; len(local) > 0 && local[0].Seq <= after+1 && (upTo == 0 || local[0].Seq <= upTo); local = local[1:] {
			e := local[0]
			if e.Seq <= after {
				continue
			}
			if _, err := fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", e.ID, e.Type, e.JSON); err != nil {
				return err
			}
			after = e.Seq
		}
		if upTo > 0 && after >= upTo {
			return nil
		}
		for {
			evs, err := h.Store.Events().List(ctx, sid, store.EventQuery{After: after, Limit: 500, SessionKnown: true})
			if err != nil {
				return err
			}
			for _, e := range evs {
				if upTo > 0 && e.Seq > upTo {
					return nil
				}
				if _, err := fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", e.ID, e.Type, e.JSON); err != nil {
					return err
				}
				after = e.Seq
			}
			if len(evs) < 500 {
				return nil
			}
		}
	}
	skipped := map[string]bool{} // previews of types the client did not ask for
	writeDelta := func(frame json.RawMessage) error {
		var f struct {
			Type    string `json:"type"`
			EventID string `json:"event_id"`
			Event   struct {
				ID   string `json:"id"`
				Type string `json:"type"`
			} `json:"event"`
		}
		if json.Unmarshal(frame, &f) != nil {
			return nil
		}
		switch f.Type {
		case "event_start":
			if !wanted[f.Event.Type] {
				skipped[f.Event.ID] = true
				return nil
			}
		case "event_delta":
			if skipped[f.EventID] {
				return nil
			}
		default:
			return nil
		}
		_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", f.Type, frame)
		return err
	}
	deleted := func() {
		at := time.Now().UTC().Format(time.RFC3339Nano)
		fmt.Fprintf(w, "event: session.deleted\ndata: {\"id\":%q,\"type\":\"session.deleted\",\"processed_at\":%q}\n\n", store.NewEventID(), at)
		_ = flush()
	}

	// A client resuming with Last-Event-ID gets what it missed at once.
	if after < st.LastSeq && (pump(st.LastSeq) != nil || flush() != nil) {
		return
	}

	keepAlive := h.KeepAlive
	if keepAlive == 0 {
		keepAlive = 15 * time.Second
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.Closing:
			return
		case <-sub.Ready():
			latest, deltas, gone, reread, fresh := sub.Pending()
			local = fresh
			if gone {
				// The session and its log are deleted: nothing left to send.
				deleted()
				return
			}
			for _, d := range deltas {
				if d.AfterSeq > after && pump(d.AfterSeq) != nil {
					return
				}
				if err := writeDelta(d.Frame); err != nil {
					return
				}
			}
			upTo := latest
			if reread {
				upTo = 0
			}
			if (latest > after || reread) && pump(upTo) != nil {
				return
			}
		case <-tick.C:
			// Notifications are not lost while the hub's connection lives,
			// and the hub asks for a re-read after it reconnects; so a tick
			// only proves the connection is alive.
			if _, err := fmt.Fprint(w, "event: ping\ndata: {\"type\":\"ping\"}\n\n"); err != nil {
				return
			}
		}
		if err := flush(); err != nil {
			return
		}
	}
}
