package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// selfHostedSession makes a session in a self_hosted environment, which
// queues its work item.
func selfHostedSession(t *testing.T, s *store.Store, ctx context.Context) store.Session {
	t.Helper()
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "mine", Config: []byte(`{"type":"self_hosted"}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Sessions().CreateFrom(ctx, ag.ID, 0, env.ID, func(store.Agent, store.Environment) (store.Session, error) {
		return store.Session{SelfHosted: true}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sess
}

// Concurrent polls hand one item to one worker.
func TestWorkPollHandsAnItemOutOnce(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	sess := selfHostedSession(t, s, ctx)

	const pollers = 8
	var wg sync.WaitGroup
	got := make(chan string, pollers)
	for i := range pollers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, err := s.Work().Poll(ctx, sess.EnvironmentID, "w"+string(rune('a'+i)), 0, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			if it != nil {
				got <- it.SessionID
			}
		}()
	}
	wg.Wait()
	close(got)
	var n int
	for id := range got {
		n++
		if id != sess.ID {
			t.Errorf("polled the item of %s, want %s", id, sess.ID)
		}
	}
	if n != 1 {
		t.Fatalf("%d polls got the item, want 1", n)
	}
	// Queueing again while the item is live does nothing.
	if err := s.Work().QueueSession(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	items, _, err := s.Work().List(ctx, sess.EnvironmentID, 10, nil)
	if err != nil || len(items) != 1 {
		t.Fatalf("items = %v, %v; want one", items, err)
	}
}

// A long poll waits for work and is woken when it is queued, before its
// time is up.
func TestWorkPollWakesOnEnqueue(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	sess := selfHostedSession(t, s, ctx)
	it, err := s.Work().Poll(ctx, sess.EnvironmentID, "", 0, time.Minute)
	if err != nil || it == nil {
		t.Fatalf("first poll: %v, %v", it, err)
	}
	if _, err := s.Work().Ack(ctx, sess.EnvironmentID, it.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Work().Stop(ctx, sess.EnvironmentID, it.ID, true); err != nil {
		t.Fatal(err)
	}

	done := make(chan *store.WorkItem, 1)
	go func() {
		// Far longer than the test may take: only the signal ends it in time.
		it, err := s.Work().Poll(ctx, sess.EnvironmentID, "", time.Hour, time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- it
	}()
	// The poll may start waiting before or after this; either way it
	// sees the item (a look follows every wait's start).
	if err := s.Work().QueueSession(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case it := <-done:
		if it == nil || it.SessionID != sess.ID {
			t.Fatalf("woken poll got %v", it)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the long poll was not woken by the enqueue")
	}
}

// Work queued through one node is announced to every node's listener
// (WorkChannel), whose WorkNotified (what its events hub calls) wakes that
// node's long polls of the queue.
func TestWorkQueuedReachesOtherNodes(t *testing.T) {
	db := pgtest.New(t)
	a, b := open(t, db.AppURL), open(t, db.AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	lctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	got := make(chan string, 4)
	go func() {
		_ = a.Listen(lctx, []string{store.WorkChannel}, func() { close(ready) }, func(_, payload string) {
			a.WorkNotified(payload)
			got <- payload
		})
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("the listener did not start")
	}
	ag, err := b.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := b.Environments().Create(ctx, store.Environment{Name: "mine", Config: []byte(`{"type":"self_hosted"}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	polled := make(chan *store.WorkItem, 1)
	go func() {
		// An hour: only the notification ends it in time.
		it, err := a.Work().Poll(ctx, env.ID, "", time.Hour, time.Minute)
		if err != nil {
			t.Error(err)
		}
		polled <- it
	}()
	sess, err := b.Sessions().CreateFrom(ctx, ag.ID, 0, env.ID, func(store.Agent, store.Environment) (store.Session, error) {
		return store.Session{SelfHosted: true}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p != string(tenant.Default)+":"+env.ID {
			t.Fatalf("payload %q", p)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("node a heard nothing of the work node b queued")
	}
	select {
	case it := <-polled:
		if it == nil || it.SessionID != sess.ID {
			t.Fatalf("node a's poll got %v", it)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("node a's long poll was not woken by node b's work")
	}
}
