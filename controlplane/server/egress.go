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
// heartbeats (those the host service vouched for: sessions placed on the
// host, under the placement's tenant): the heartbeat hands them over
// without waiting (add), and one loop writes them to PostgreSQL (run),
// then acknowledges the heartbeat. Its queue is bounded; a batch that
// does not fit, or whose write fails, is not acknowledged, and its host
// sends it again with a later heartbeat (stored once, by record id).
type egressSink struct {
	st       *store.Store
	log      *slog.Logger
	ch       chan egressBatch
	deferred atomic.Int64 // batches not queued, since start
}

type egressBatch struct {
	hostID string
	recs   []store.EgressRecord
	ack    func()
}

// egressQueue is the batches (of at most 512 records) the sink holds.
const egressQueue = 64

func newEgressSink(st *store.Store, log *slog.Logger) *egressSink {
	return &egressSink{st: st, log: log, ch: make(chan egressBatch, egressQueue)}
}

// add queues one heartbeat's records; it never blocks. ack is called once
// they are stored.
func (e *egressSink) add(hostID string, recs []*pb.EgressRecord, dropped int64, ack func()) {
	if e == nil {
		return
	}
	if dropped > 0 {
		e.log.Warn("a host dropped egress audit records (its queue was full)", "host_id", hostID, "dropped", dropped)
	}
	if len(recs) == 0 {
		ack()
		return
	}
	b := egressBatch{hostID: hostID, recs: make([]store.EgressRecord, 0, len(recs)), ack: ack}
	for _, r := range recs {
		b.recs = append(b.recs, store.EgressRecord{
			TenantID: tenant.ID(r.GetTenant()), SessionID: r.GetSessionId(), Host: r.GetHost(), Port: r.GetPort(),
			Address: r.GetAddress(), Allowed: r.GetAllowed(), Reason: r.GetReason(),
			BytesUp: r.GetBytesUp(), BytesDown: r.GetBytesDown(), CredentialInjected: r.GetCredentialInjected(),
			Start: r.GetStartedAt().AsTime(), End: r.GetEndedAt().AsTime(), RecordID: r.GetId(),
		})
	}
	select {
	case e.ch <- b:
	default:
		n := e.deferred.Add(1)
		e.log.Warn("egress audit queue full: the host keeps the heartbeat's records and sends them again", "host_id", hostID, "records", len(b.recs), "deferred_total", n)
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
				// Not acknowledged: the host sends them again.
				e.log.Warn("storing egress audit records failed; the host sends them again", "host_id", b.hostID, "records", len(b.recs), "err", err)
			} else {
				b.ack()
			}
			if skipped > 0 {
				e.log.Warn("egress audit records without a valid tenant skipped", "host_id", b.hostID, "skipped", skipped)
			}
		}
	}
}
