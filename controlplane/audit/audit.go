// Package audit records who did what to which resource, when, from where,
// and how it ended: every write and every refused request, on both APIs.
// Records go to the store's audit log through a bounded queue and one
// writer, so a flood of refused requests costs the database one insert at a
// time rather than one per request in parallel; when the queue is full,
// records are dropped and counted, and the count is logged.
//
// A record never holds a secret: principals are named by subject and key
// id, resources by route or method and target id.
package audit

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"corral.dev/corral/controlplane/store"
)

// Outcomes.
const (
	OK              = "ok"
	Denied          = "denied"
	Unauthenticated = "unauthenticated"
	RateLimited     = "rate_limited"
)

// Sink stores records. store.Audit implements it.
type Sink interface {
	Append(ctx context.Context, rec store.AuditRecord) error
}

// Log queues records for its writer.
type Log struct {
	sink Sink
	log  *slog.Logger
	q    chan store.AuditRecord
	done chan struct{}

	// mu guards closed; Record holds it shared while it queues, so Close
	// never closes q under a sender.
	mu      sync.RWMutex
	closed  bool
	dropped atomic.Int64
}

// New starts a Log writing to sink; queue bounds the records waiting.
func New(sink Sink, queue int, log *slog.Logger) *Log {
	l := &Log{sink: sink, log: log, q: make(chan store.AuditRecord, queue), done: make(chan struct{})}
	go l.run()
	return l
}

// Record queues rec; it never blocks. After Close it drops rec, and
// logs that it did (a late request on a stopping server).
func (l *Log) Record(rec store.AuditRecord) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		l.log.Warn("audit record after the audit log closed: dropped", "action", rec.Action, "resource", rec.Resource, "outcome", rec.Outcome)
		return
	}
	select {
	case l.q <- rec:
	default:
		if n := l.dropped.Add(1); n == 1 || n%1000 == 0 {
			l.log.Error("audit queue full: records dropped", "dropped_total", n)
		}
	}
}

// Dropped is how many records were dropped because the queue was full.
func (l *Log) Dropped() int64 { return l.dropped.Load() }

// Close writes what is queued and stops the writer.
func (l *Log) Close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.q)
	}
	l.mu.Unlock()
	<-l.done
}

func (l *Log) run() {
	defer close(l.done)
	for rec := range l.q {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := l.sink.Append(ctx, rec); err != nil {
			l.log.Error("writing audit record", "action", rec.Action, "resource", rec.Resource, "outcome", rec.Outcome, "request_id", rec.RequestID, "err", err)
		}
		cancel()
	}
}
