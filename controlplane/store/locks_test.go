package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store/pgtest"
)

// A session's sandbox lock excludes holders on other nodes (two stores
// stand for two nodes), not other sessions; a wait ends with its context
// without taking the lock.
func TestLockSandboxAcrossNodes(t *testing.T) {
	db := pgtest.New(t)
	a, b := open(t, db.AppURL), open(t, db.AppURL)
	ctx := context.Background()
	unlock, err := a.LockSandbox(ctx, "sesn_1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.LockSandbox(ctx, "sesn_2")
	if err != nil {
		t.Fatalf("another session's lock: %v", err)
	}
	other()

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = b.LockSandbox(short, "sesn_1")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock held by the other node: err = %v, want deadline exceeded", err)
	}

	got := make(chan func(), 1)
	go func() {
		u, err := b.LockSandbox(ctx, "sesn_1")
		if err != nil {
			t.Error(err)
			u = func() {}
		}
		got <- u
	}()
	select {
	case <-got:
		t.Fatal("the second node took the lock while the first held it")
	case <-time.After(300 * time.Millisecond): // a bounded check that it keeps waiting
	}
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(10 * time.Second):
		t.Fatal("the lock was not handed over after unlock")
	}
}
