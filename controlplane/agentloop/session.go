package agentloop

import (
	"context"
	"fmt"
	"slices"
)

// session is a session as one Run knows it: the agent snapshot and the log
// up to sequence number last. The Run reads it whole once, when it starts;
// before each later step it reads only the events appended since
// (Store.LoadSince): the previous step's own, and whatever another writer
// appended meanwhile (a client's message, a session.updated), usually a
// handful of rows whatever the length of the log.
//
// The one change to events already read is Processed, which only the
// session's runner sets, in its commits: a commit that succeeds marks its
// consumed events here too (commit). Anything else that could leave this
// copy different from the stored log drops it, and the next step reads
// the log whole again: a commit that failed (its outcome is unknown), a
// step that failed, a session.updated (the agent snapshot changed), MCP
// tools pinned (Store.Load returns the pins), events out of order.
type session struct {
	loaded bool
	agent  Agent
	log    []Event
	at     map[string]int // event id -> index in log
	last   int64          // sequence number of the newest event in log
}

// drop forgets the copy: the next refresh reads the log whole.
func (s *session) drop() { *s = session{} }

// refresh brings the copy up to date with the store and reports whether
// the store had anything the copy lacked.
func (r *Runner) refresh(ctx context.Context, sessionID string, s *session) (changed bool, err error) {
	if s.loaded {
		tail, err := r.Store.LoadSince(ctx, sessionID, s.last)
		if err != nil {
			s.drop()
			return false, fmt.Errorf("loading session %s: %w", sessionID, err)
		}
		if !slices.ContainsFunc(tail, func(e Event) bool { return e.Type == SessionUpdated }) && s.extend(tail) {
			return len(tail) > 0, nil
		}
	}
	agent, log, err := r.Store.Load(ctx, sessionID)
	if err != nil {
		s.drop()
		return false, fmt.Errorf("loading session %s: %w", sessionID, err)
	}
	*s = session{loaded: true, agent: agent, at: make(map[string]int, len(log))}
	if !s.extend(log) {
		s.drop()
		return false, fmt.Errorf("loading session %s: the store returned its events out of order", sessionID)
	}
	return true, nil
}

// extend appends events that follow the copy's newest one, in order. It
// reports false when one does not.
func (s *session) extend(events []Event) bool {
	for _, e := range events {
		if e.Seq <= s.last {
			return false
		}
		s.at[e.ID] = len(s.log)
		s.log = append(s.log, e)
		s.last = e.Seq
	}
	return true
}

// commit makes one of the step's commits and keeps the copy in step with
// it: the events it consumed are processed here too; its appended events
// come with the next refresh. A commit that fails may or may not have
// been applied, so the copy is dropped.
func (r *Runner) commit(ctx context.Context, sessionID string, s *session, c Commit) error {
	if err := r.Store.Commit(ctx, sessionID, c); err != nil {
		s.drop()
		return err
	}
	for _, id := range c.Consume {
		i, ok := s.at[id]
		if !ok {
			s.drop() // never the case: Decide consumes events of the log
			return nil
		}
		s.log[i].Processed = true
	}
	return nil
}
