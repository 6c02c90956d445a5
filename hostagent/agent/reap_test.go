package agent_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// logBuffer collects an agent's log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// reaped reports whether the log says the sandbox id was reaped.
func (b *logBuffer) reaped(id string) bool {
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, `msg="reaping an unclaimed sandbox container"`) && strings.Contains(line, "id="+id+" ") && strings.Contains(line, "age=") {
			return true
		}
	}
	return false
}

// reapPass makes the agent's reaper run one pass and waits for its end: the
// reaper takes the second tick only once the pass of the first is over.
func (e *env) reapPass() {
	e.t.Helper()
	for range 2 {
		select {
		case e.reapTick <- e.clock.Now():
		case <-time.After(time.Minute):
			e.t.Fatal("the reaper did not take its tick")
		}
	}
}

func keys(refs []driver.Ref) string {
	var ks []string
	for _, r := range refs {
		ks = append(ks, r.Key)
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

// TestReapsUnclaimedSandboxes: a sandbox the driver has that neither a
// record nor a placement claims (left by a crash between Create and the
// record, or a failed destroy) is destroyed once ReapGrace (10 minutes by
// default) has passed since its creation, and the agent logs it; recorded
// sandboxes stay.
func TestReapsUnclaimedSandboxes(t *testing.T) {
	e := setup(t)
	e.reapTick = make(chan time.Time)
	logs := &logBuffer{}
	e.logger = slog.New(slog.NewTextHandler(logs, nil))
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("kept", nil); err != nil {
		t.Fatal(err)
	}
	leak, err := e.fake.Create(context.Background(), driver.Spec{Key: "leak"})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(9 * time.Minute)
	e.reapPass()
	if got := keys(refs(t, e.fake)); got != "kept,leak" {
		t.Fatalf("within the grace period the driver holds %s, want kept,leak", got)
	}
	e.clock.Advance(2 * time.Minute)
	e.reapPass()
	if got := keys(refs(t, e.fake)); got != "kept" {
		t.Fatalf("after the grace period the driver holds %s, want kept", got)
	}
	if !logs.reaped(leak.ID) {
		t.Fatalf("the log does not say %s was reaped:\n%s", leak.ID, logs)
	}
	if hb := e.heartbeat(r); len(hb.Sandboxes) != 1 || hb.Sandboxes[0].Key != "kept" {
		t.Fatalf("heartbeat sandboxes = %v", hb.Sandboxes)
	}
}

// TestReapsUnclaimedSandboxesGVisor: with real gVisor containers on the
// shared containerd, the agent reaps, after the grace period, a container
// with its own labels and no record, and one whose state dir is gone (its
// agent's state deleted, as a test's temporary directory is); it never
// touches the container of another host's live state dir.
func TestReapsUnclaimedSandboxesGVisor(t *testing.T) {
	addr := containerdtest.Address(t)
	e := setup(t)
	ctx := context.Background()
	newDriver := func(dir string) *containerd.Driver {
		t.Helper()
		d, err := containerd.New(ctx, containerd.Config{Address: addr, StateDir: dir, Runtime: containerd.RuntimeGVisor})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	create := func(d *containerd.Driver, key string) driver.Ref {
		t.Helper()
		ref, err := d.Create(ctx, driver.Spec{Key: key, Image: "localhost/corral/busybox:1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Destroy(context.Background(), ref) })
		return ref
	}
	own := newDriver(t.TempDir())
	e.wrap = func(driver.Driver) driver.Driver { return own }
	e.clock.Set(time.Now()) // containerd stamps creation with the real clock
	e.reapTick = make(chan time.Time)
	logs := &logBuffer{}
	e.logger = slog.New(slog.NewTextHandler(logs, nil))
	r := e.start()
	defer r.stop()

	leak := create(own, "leak")
	other := newDriver(t.TempDir())
	theirs := create(other, "theirs")
	goneDir := filepath.Join(t.TempDir(), "gone")
	gone := newDriver(goneDir)
	orphan := create(gone, "orphan")
	if err := os.RemoveAll(goneDir); err != nil {
		t.Fatal(err)
	}
	has := func(d *containerd.Driver, id string) bool {
		t.Helper()
		refs, err := d.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(refs, func(r driver.Ref) bool { return r.ID == id })
	}

	e.reapPass()
	if !has(own, leak.ID) || !has(gone, orphan.ID) || !has(other, theirs.ID) {
		t.Fatalf("within the grace period: leak %v, orphan %v, theirs %v; want all three still there", has(own, leak.ID), has(gone, orphan.ID), has(other, theirs.ID))
	}
	e.clock.Advance(11 * time.Minute)
	e.reapPass()
	if has(own, leak.ID) {
		t.Errorf("the agent's unrecorded container %s is still there after the grace period", leak.ID)
	}
	if has(gone, orphan.ID) {
		t.Errorf("the orphan %s is still there after the grace period", orphan.ID)
	}
	if !has(other, theirs.ID) {
		t.Errorf("the agent reaped %s, another host's container", theirs.ID)
	}
	for _, id := range []string{leak.ID, orphan.ID} {
		if !logs.reaped(id) {
			t.Errorf("the log does not say %s was reaped:\n%s", id, logs)
		}
	}
	if logs.reaped(theirs.ID) {
		t.Errorf("the log says %s, another host's, was reaped", theirs.ID)
	}
}
