package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// egressSink stores the egress audit records hosts send with their
// heartbeats: the heartbeat hands them over without waiting (add), and one
// loop writes them to PostgreSQL (run). Its queue is bounded; what does
// not fit is counted and logged, never silently lost.
type egressSink struct {
	st      *store.Store
	log     *slog.Logger
	ch      chan egressBatch
	dropped atomic.Int64 // records not queued, since the last log line
}

type egressBatch struct {
	hostID string
	recs   []store.EgressRecord
}

// egressQueue is the batches (of at most 512 records) the sink holds.
const egressQueue = 64

func newEgressSink(st *store.Store, log *slog.Logger) *egressSink {
	return &egressSink{st: st, log: log, ch: make(chan egressBatch, egressQueue)}
}

// add queues one heartbeat's records; it never blocks.
func (e *egressSink) add(hostID string, recs []*pb.EgressRecord, dropped int64) {
	if e == nil {
		return
	}
	if dropped > 0 {
		e.log.Warn("a host dropped egress audit records (its queue was full)", "host_id", hostID, "dropped", dropped)
	}
	if len(recs) == 0 {
		return
	}
	b := egressBatch{hostID: hostID, recs: make([]store.EgressRecord, 0, len(recs))}
	for _, r := range recs {
		b.recs = append(b.recs, store.EgressRecord{
			TenantID: tenant.ID(r.GetTenant()), SessionID: r.GetSessionId(), Host: r.GetHost(), Port: r.GetPort(),
			Address: r.GetAddress(), Allowed: r.GetAllowed(), Reason: r.GetReason(),
			BytesUp: r.GetBytesUp(), BytesDown: r.GetBytesDown(), CredentialInjected: r.GetCredentialInjected(),
			Start: r.GetStartedAt().AsTime(), End: r.GetEndedAt().AsTime(),
		})
	}
	select {
	case e.ch <- b:
	default:
		n := e.dropped.Add(int64(len(b.recs)))
		e.log.Warn("egress audit queue full: records dropped", "host_id", hostID, "dropped_total", n)
	}
}

// run writes queued batches until ctx ends.
func (e *egressSink) run(ctx context.Context) {
	if e == nil {
		return // a node without a fleet
	}
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-e.ch:
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			skipped, err := e.st.Egress().Append(wctx, b.hostID, b.recs)
			cancel()
			if err != nil {
				e.log.Warn("storing egress audit records failed", "host_id", b.hostID, "records", len(b.recs), "err", err)
			}
			if skipped > 0 {
				e.log.Warn("egress audit records without a valid tenant skipped", "host_id", b.hostID, "skipped", skipped)
			}
		}
	}
}
