package store_test

import (
	"context"
	"fmt"
	"testing"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// A tenant transaction begins with its first statement and an append
// commits with its last (tenantTx): on a store of one connection, each way
// such a transaction can fail (its first statement, a check between
// statements, the statement sent with COMMIT) leaves nothing of it stored
// and the connection clean for the next tenant, whose setting alone then
// applies.
func TestTenantTransactionsEndCleanlyOnOneConnection(t *testing.T) {
	db := pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s, err := store.Open(context.Background(), db.AppURL, store.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	a := tenant.With(context.Background(), tenant.Default)
	b := tenant.With(context.Background(), "tenant_b")
	sess, err := newSession(t, s, a)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id string) store.NewEvent {
		return store.NewEvent{ID: id, Type: "agent.message", Body: []byte(`{"id":"` + id + `","type":"agent.message"}`)}
	}
	appendOK := func(id string, want int64) {
		t.Helper()
		last, err := s.Events().Append(a, sess.ID, store.Append{Events: []store.NewEvent{ev(id)}, Status: store.SessionRunning})
		if err != nil || last != want {
			t.Fatalf("append %s: last %d, %v; want %d", id, last, err, want)
		}
	}
	// checkClean: the other tenant, on the same connection, sees none of
	// the first tenant's session, and the first sees its log as appended.
	checkClean := func(want ...string) {
		t.Helper()
		if _, err := s.Events().List(b, sess.ID, store.EventQuery{}); !errdefs.IsNotFound(err) {
			t.Fatalf("the other tenant listed the session's events: %v", err)
		}
		evs, err := s.Events().List(a, sess.ID, store.EventQuery{})
		if err != nil {
			t.Fatal(err)
		}
		// The same through one-round-trip reads: a page of a known
		// session's log, and its row.
		if evs, err := s.Events().List(b, sess.ID, store.EventQuery{SessionKnown: true}); err != nil || len(evs) != 0 {
			t.Fatalf("the other tenant read %d of the session's events: %v", len(evs), err)
		}
		if _, err := s.Sessions().Get(b, sess.ID); !errdefs.IsNotFound(err) {
			t.Fatalf("the other tenant read the session: %v", err)
		}
		if got, err := s.Sessions().Get(a, sess.ID); err != nil || got.ID != sess.ID {
			t.Fatalf("reading the session: %+v, %v", got, err)
		}
		known, err := s.Events().List(a, sess.ID, store.EventQuery{SessionKnown: true})
		if err != nil || len(known) != len(evs) {
			t.Fatalf("the known session's log: %d events, %v; want %d", len(known), err, len(evs))
		}
		if len(evs) > 0 {
			if after, err := s.Events().List(a, sess.ID, store.EventQuery{After: evs[len(evs)-1].Seq}); err != nil || len(after) != 0 {
				t.Fatalf("the page after the last event: %d events, %v; want none", len(after), err)
			}
		}
		var got []string
		for _, e := range evs {
			got = append(got, e.ID)
		}
		if len(got) != len(want) {
			t.Fatalf("the log holds %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("the log holds %v, want %v", got, want)
			}
		}
	}

	appendOK("sevt_1", 1)
	checkClean("sevt_1")

	// The first statement finds nothing: the session row lock of another
	// tenant's session.
	if _, err := s.Events().Append(b, sess.ID, store.Append{Events: []store.NewEvent{ev("sevt_b")}}); !errdefs.IsNotFound(err) {
		t.Fatalf("the other tenant appended to the session: %v", err)
	}
	checkClean("sevt_1")

	// A check between statements fails: the event to consume is not queued.
	if _, err := s.Events().Append(a, sess.ID, store.Append{Consume: []string{"sevt_1"}, Events: []store.NewEvent{ev("sevt_2")}}); !errdefs.IsConflict(err) {
		t.Fatalf("consuming an event that is not queued: %v, want a conflict", err)
	}
	checkClean("sevt_1")

	// The statement sent with COMMIT fails: its event id repeats.
	if _, err := s.Events().Append(a, sess.ID, store.Append{Events: []store.NewEvent{ev("sevt_3"), ev("sevt_1")}}); err == nil {
		t.Fatal("an append repeating an event id was accepted")
	}
	checkClean("sevt_1")

	// A client's append, one round trip shorter the same way, and the
	// runner's after it: the sequence numbers stay dense.
	if _, err := s.Events().AppendClient(a, sess.ID, []store.NewEvent{ev("sevt_4")}); err != nil {
		t.Fatal(err)
	}
	appendOK("sevt_5", 3)
	checkClean("sevt_1", "sevt_4", "sevt_5")
	if got, err := s.Sessions().Get(a, sess.ID); err != nil || got.Status != store.SessionRunning {
		t.Fatalf("the session after its appends: %+v, %v", got, err)
	}
}

// Appends to one session from many connections at once, the runner's and
// clients', each one statement behind the session's row lock and sent with
// its COMMIT: sequence numbers stay dense, in order, one per event.
func TestConcurrentAppendsKeepSequenceNumbersDense(t *testing.T) {
	db := pgtest.New(t)
	s, err := store.Open(context.Background(), db.AppURL, store.Options{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	a := tenant.With(context.Background(), tenant.Default)
	sess, err := newSession(t, s, a)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 20
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range each {
				id := fmt.Sprintf("sevt_%d_%d", w, i)
				ev := store.NewEvent{ID: id, Type: "agent.message", Body: []byte(`{"id":"` + id + `","type":"agent.message"}`)}
				var err error
				if w%2 == 0 {
					_, err = s.Events().Append(a, sess.ID, store.Append{Events: []store.NewEvent{ev}})
				} else {
					_, err = s.Events().AppendClient(a, sess.ID, []store.NewEvent{ev})
				}
				if err != nil {
					errs <- fmt.Errorf("append %s: %w", id, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Events().List(a, sess.ID, store.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, e := range evs {
		if e.Seq != int64(i+1) || seen[e.ID] {
			t.Fatalf("event %d of the log: seq %d id %s (seen before: %v); want seq %d, once", i, e.Seq, e.ID, seen[e.ID], i+1)
		}
		seen[e.ID] = true
	}
	if len(evs) != writers*each {
		t.Fatalf("the log holds %d events, want %d", len(evs), writers*each)
	}
}
