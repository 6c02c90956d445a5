package audit

import (
	"context"
	"sync"
	"testing"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/logging"
)

type sink struct {
	mu    sync.Mutex
	recs  []store.AuditRecord
	block chan struct{}
}

func (s *sink) Append(_ context.Context, r store.AuditRecord) error {
	if s.block != nil {
		<-s.block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, r)
	return nil
}

func TestCloseWritesWhatIsQueued(t *testing.T) {
	s := &sink{}
	l := New(s, 100, logging.Discard())
	for range 50 {
		l.Record(store.AuditRecord{Action: "agents:write"})
	}
	l.Close()
	if len(s.recs) != 50 || l.Dropped() != 0 {
		t.Fatalf("wrote %d, dropped %d", len(s.recs), l.Dropped())
	}
}

// A full queue drops and counts rather than block the request.
func TestFullQueueDrops(t *testing.T) {
	s := &sink{block: make(chan struct{})}
	l := New(s, 4, logging.Discard())
	for range 20 {
		l.Record(store.AuditRecord{})
	}
	if l.Dropped() < 15 {
		t.Fatalf("dropped %d of 20 with a queue of 4 and a stuck writer", l.Dropped())
	}
	close(s.block)
	l.Close()
	if got := int64(len(s.recs)) + l.Dropped(); got != 20 {
		t.Fatalf("written %d + dropped %d != 20", len(s.recs), l.Dropped())
	}
}

// A record after Close (a late request on a stopping server) is dropped,
// never a send on the closed queue.
func TestRecordAfterCloseIsDropped(t *testing.T) {
	s := &sink{}
	l := New(s, 4, logging.Discard())
	l.Record(store.AuditRecord{Action: "before"})
	l.Close()
	l.Record(store.AuditRecord{Action: "after"})
	l.Close() // twice is fine
	if len(s.recs) != 1 || s.recs[0].Action != "before" {
		t.Fatalf("records: %+v", s.recs)
	}
}
