package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The sink acknowledges a heartbeat's records once they are in
// PostgreSQL, stores a record sent again once, and does not acknowledge a
// batch whose write failed (its host sends it again).
func TestEgressSinkAcksWhatItStored(t *testing.T) {
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.Open(ctx, db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Tenants().Create(ctx, "tenant_a", "a"); err != nil {
		t.Fatal(err)
	}
	sink := newEgressSink(st, logging.Discard())
	done := make(chan struct{})
	go func() { sink.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	now := timestamppb.Now()
	rec := func(id, tid string) []*pb.EgressRecord {
		return []*pb.EgressRecord{{Id: id, Tenant: tid, SessionId: "s1", Host: "a.test", Port: 443, StartedAt: now, EndedAt: now}}
	}
	acked := func() (func(), <-chan struct{}) {
		ch := make(chan struct{})
		return func() { close(ch) }, ch
	}
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("no ack for %s", what)
		}
	}
	ack1, ch1 := acked()
	sink.add("h1", rec("r1", "tenant_a"), 0, ack1)
	wait(ch1, "the first send")
	ack2, ch2 := acked()
	sink.add("h1", rec("r1", "tenant_a"), 0, ack2) // sent again: a lost ack
	wait(ch2, "the resend")
	rows, err := st.Egress().List(tenant.With(ctx, "tenant_a"), "", 0, 10)
	if err != nil || len(rows) != 1 || rows[0].RecordID != "r1" {
		t.Fatalf("rows after a resend: %+v, %v", rows, err)
	}

	// A write that fails (a tenant PostgreSQL does not know) is not
	// acknowledged; the batch after it, written in order, is.
	failed := make(chan struct{}, 1)
	sink.add("h1", rec("r2", "tenant_gone"), 0, func() { failed <- struct{}{} })
	ack3, ch3 := acked()
	sink.add("h1", rec("r3", "tenant_a"), 0, ack3)
	wait(ch3, "the batch after a failed one")
	select {
	case <-failed:
		t.Fatal("a batch whose write failed was acknowledged")
	default:
	}
	// A heartbeat with nothing to store (all rejected) is acknowledged at
	// once.
	ack4, ch4 := acked()
	sink.add("h1", nil, 0, ack4)
	wait(ch4, "an empty batch")
}
