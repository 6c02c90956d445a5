package agentloop

import (
	"container/list"
	"context"
	"fmt"
	"slices"

	"corral.dev/corral/controlplane/model"
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
	size   int            // bytes of the log's tenant-written content (eventSize)
}

// drop forgets the copy: the next refresh reads the log whole.
func (s *session) drop() { *s = session{} }

// resume checks a copy an earlier Run left (this node's runner may have
// been another meanwhile, whose commits consumed events the copy shows
// queued) and drops it unless it still holds. Consuming is the one change
// made to events already written, so a copy that shows none queued holds
// (the usual case: a Run ends with its input consumed), and one that does
// holds if, brought up to date with the tail, the events it shows
// unconsumed are exactly the store's queued ones. A fresh copy is left as
// it is, for the first step to read whole.
func (r *Loop) resume(ctx context.Context, sessionID string, s *session) error {
	if !s.loaded || !slices.ContainsFunc(s.log, func(e Event) bool { return !e.Processed }) {
		return nil
	}
	if _, err := r.refresh(ctx, sessionID, s); err != nil {
		return err
	}
	if !s.loaded { // refresh read it whole: nothing to check
		return nil
	}
	queued, err := r.Store.Queued(ctx, sessionID)
	if err != nil {
		s.drop()
		return fmt.Errorf("loading session %s: %w", sessionID, err)
	}
	want := make(map[string]bool, len(queued))
	for _, e := range queued {
		want[e.ID] = true
	}
	n := 0
	for _, e := range s.log {
		if !e.Processed {
			if !want[e.ID] {
				s.drop()
				return nil
			}
			n++
		}
	}
	if n != len(want) {
		s.drop()
	}
	return nil
}

// Bounds of the copies a Pool keeps between wakes: the least recently kept
// goes first once they are too many or hold too much; a copy larger than
// maxKeptCopyBytes is not kept (its session's next wake reads it again).
const (
	maxKeptCopies    = 256
	maxKeptBytes     = 256 << 20
	maxKeptCopyBytes = 16 << 20
)

// keptCopies is a bounded set of sessions' copies, by session id, that
// forgets the least recently kept first. Its owner guards it.
type keptCopies struct {
	max, maxBytes int
	bytes         int                      // the kept copies' sizes
	byID          map[string]*list.Element // of keptCopy
	lru           *list.List               // most recently kept at the front
}

type keptCopy struct {
	id string
	s  session
}

func newKeptCopies(max, maxBytes int) *keptCopies {
	return &keptCopies{max: max, maxBytes: maxBytes, byID: map[string]*list.Element{}, lru: list.New()}
}

// take removes and returns a session's copy (a fresh one if none is kept).
func (k *keptCopies) take(id string) session {
	e, ok := k.byID[id]
	if !ok {
		return session{}
	}
	delete(k.byID, id)
	s := k.lru.Remove(e).(keptCopy).s
	k.bytes -= s.size
	return s
}

// put keeps a session's copy, if it is worth keeping.
func (k *keptCopies) put(id string, s session) {
	k.take(id)
	if !s.loaded || s.size > maxKeptCopyBytes {
		return
	}
	k.byID[id] = k.lru.PushFront(keptCopy{id: id, s: s})
	k.bytes += s.size
	for k.lru.Len() > k.max || k.bytes > k.maxBytes {
		old := k.lru.Back().Value.(keptCopy)
		k.take(old.id)
	}
}

// refresh brings the copy up to date with the store and reports whether
// the store had anything the copy lacked.
func (r *Loop) refresh(ctx context.Context, sessionID string, s *session) (changed bool, err error) {
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
		s.size += eventSize(e)
	}
	return true
}

// eventSize is about the memory an event holds: its text, inputs and
// error, which the tenant (its messages) and the model and tools (their
// output) fill, plus a fixed part.
func eventSize(e Event) int {
	n := 256 + len(e.Input) + len(e.Error) + len(e.DenyMessage)
	var blocks func(bs []model.Block)
	blocks = func(bs []model.Block) {
		for _, b := range bs {
			n += 64 + len(b.Text) + len(b.Input)
			blocks(b.Content)
		}
	}
	blocks(e.Content)
	if e.Private != nil {
		for _, b := range e.Private.Blocks {
			n += 64 + len(b.Thinking) + len(b.Signature) + len(b.Data) + len(b.Raw) + len(b.Input)
		}
	}
	return n
}

// commit makes one of the step's commits and keeps the copy in step with
// it: the events it consumed are processed here too; its appended events
// come with the next refresh. A commit that fails may or may not have
// been applied, so the copy is dropped.
func (r *Loop) commit(ctx context.Context, sessionID string, s *session, c Commit) error {
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
