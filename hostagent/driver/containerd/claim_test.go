package containerd

import (
	"context"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// TestClaim: a pooled sandbox claimed for a session takes the session's
// key, labels and environment in one step, loses the pool label, and runs
// the session's commands with that environment; it cannot be claimed
// twice, nor can a sandbox that was never pooled, one whose workspace is
// not empty, or one for a key that has a sandbox already.
func TestClaim(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mk := func(key string, labels map[string]string) driver.Ref {
		t.Helper()
		ref, err := d.Create(ctx, driver.Spec{Key: key, Image: busybox, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	pooled := mk("pool-1", map[string]string{driver.PoolLabel: "c1"})
	spec := driver.Spec{Key: "s1", Env: map[string]string{"SESSION_VAR": "one"}, Labels: map[string]string{"tenant": "a"}}
	if _, err := d.Claim(ctx, pooled, driver.Spec{Key: "s0", Labels: map[string]string{driver.PoolLabel: "x"}}); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
		t.Fatalf("a claim that sets the pool label: %v, want invalid argument", err)
	}
	claimed, err := d.Claim(ctx, pooled, spec)
	if err != nil {
		t.Fatal(err)
	}
	if claimed.ID != pooled.ID || claimed.Key != "s1" || len(claimed.Labels) != 1 || claimed.Labels["tenant"] != "a" {
		t.Fatalf("claimed ref %+v", claimed)
	}
	refs, err := d.List(ctx)
	if err != nil || len(refs) != 1 || refs[0].Key != "s1" || refs[0].Labels[driver.PoolLabel] != "" {
		t.Fatalf("List after the claim: %+v, %v", refs, err)
	}
	sb, err := d.Attach(ctx, claimed)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"env"}})
	if err != nil || !strings.Contains(string(res.Stdout), "SESSION_VAR=one\n") {
		t.Fatalf("env in the claimed sandbox: %q, %v", res.Stdout, err)
	}
	// Create for the same key returns the claimed sandbox.
	if again, err := d.Create(ctx, driver.Spec{Key: "s1", Image: busybox}); err != nil || again.ID != claimed.ID {
		t.Fatalf("Create of the claimed key: %+v, %v", again, err)
	}
	if _, err := d.Claim(ctx, pooled, driver.Spec{Key: "s2"}); errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
		t.Fatalf("claiming a claimed sandbox again: %v, want failed precondition", err)
	}
	plain := mk("plain", nil)
	if _, err := d.Claim(ctx, plain, driver.Spec{Key: "s3"}); errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
		t.Fatalf("claiming a sandbox never pooled: %v, want failed precondition", err)
	}
	used := mk("pool-2", map[string]string{driver.PoolLabel: "c1"})
	usedSB, err := d.Attach(ctx, used)
	if err != nil {
		t.Fatal(err)
	}
	if err := usedSB.WriteFile(ctx, "left.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Claim(ctx, used, driver.Spec{Key: "s4"}); errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
		t.Fatalf("claiming a pooled sandbox with a file in its workspace: %v, want failed precondition", err)
	}
	fresh := mk("pool-3", map[string]string{driver.PoolLabel: "c1"})
	if _, err := d.Claim(ctx, fresh, driver.Spec{Key: "s1"}); errdefs.KindOf(err) != errdefs.AlreadyExistsKind {
		t.Fatalf("claiming for a key that has a sandbox: %v, want already exists", err)
	}
	for _, r := range []driver.Ref{claimed, plain, used, fresh} {
		if err := d.Destroy(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}
