package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

func TestEvictionUnderMemoryPressure(t *testing.T) { testEviction(t, "memory_pressure") }

func TestEvictionUnderDiskPressure(t *testing.T) { testEviction(t, "disk_pressure") }

func testEviction(t *testing.T, reason string) {
	e := setup(t)
	// Under memory pressure a driver that can pause pauses first
	// (pressure_test.go); this one cannot.
	e.wrap = func(d driver.Driver) driver.Driver { return noPause{d} }
	// Pressure lasts while the driver holds more than two sandboxes.
	e.pressureFn = func(ctx context.Context) (agent.Pressure, error) {
		rs, err := e.fake.List(ctx)
		on := e.pressure.Load() && len(rs) > 2
		return agent.Pressure{Memory: on && reason == "memory_pressure", Disk: on && reason == "disk_pressure"}, err
	}
	started, canceled := make(chan struct{}), make(chan struct{})
	e.fake.Handle("block", func(ctx context.Context, p *drivertest.Proc) int {
		close(started)
		<-ctx.Done()
		close(canceled)
		return 137
	})
	r := e.start()
	defer r.stop()
	for _, k := range []string{"busy", "old", "new"} {
		if _, err := e.ensure(k, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := e.sandboxClient()
	ctx := context.Background()
	// "busy" is the least recently used but has a command running.
	execCtx, cancelExec := context.WithCancel(ctx)
	defer cancelExec()
	go func() { _, _ = c.Exec(execCtx, &pb.ExecRequest{Key: "busy", Command: []string{"block"}}) }()
	<-started
	e.clock.Advance(time.Minute)
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "old", Path: "dir/work.txt", Data: []byte("precious"), Mode: 0o640}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	if _, _, err := execStream(t, c, "new", "true"); err != nil {
		t.Fatal(err)
	}

	e.pressure.Store(true)
	hb := e.heartbeat(r)
	if len(hb.Evictions) != 1 || hb.Evictions[0].Key != "old" || hb.Evictions[0].Reason != reason {
		t.Fatalf("evictions = %v, want old under %s", hb.Evictions, reason)
	}
	for _, c := range hb.Conditions {
		if !c.Ok {
			t.Errorf("condition %s not ok after the eviction relieved the pressure: %s", c.Type, c.Message)
		}
	}
	for _, s := range hb.Sandboxes {
		want := pb.SandboxState_SANDBOX_STATE_READY
		if s.Key == "old" {
			want = pb.SandboxState_SANDBOX_STATE_EVICTED
		}
		if s.State != want {
			t.Errorf("%s is %v, want %v", s.Key, s.State, want)
		}
	}
	if hb.Allocated.GetMemoryBytes() != 2*512<<20 {
		t.Errorf("allocated after eviction = %v", hb.Allocated)
	}
	if hb := e.heartbeat(r); len(hb.Evictions) != 0 {
		t.Fatalf("eviction reported twice: %v", hb.Evictions)
	}
	if _, _, err := execStream(t, c, "old", "true"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "evicted") {
		t.Fatalf("exec in evicted sandbox: %v", err)
	}

	// Ensured again, it comes back with its workspace.
	e.pressure.Store(false)
	if _, err := e.ensure("old", nil); err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "old", Path: "dir/work.txt"})
	if err != nil || string(got.Data) != "precious" {
		t.Fatalf("restored workspace: %v %v", got, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.stateDir, "evicted")); len(ents) != 0 {
		t.Fatalf("kept workspace not cleaned up after restore: %v", ents)
	}

	// The busy sandbox's command ran on through all this; the caller going
	// away stops it.
	cancelExec()
	select {
	case <-canceled:
	case <-time.After(20 * time.Second):
		t.Fatal("cancelling the call did not stop the command")
	}
}

func TestRestartAfterCrashMidEviction(t *testing.T) {
	e := setup(t)
	r := e.start()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	r.stop()
	// A crash after the eviction's record was written but before the
	// sandbox was removed: the record says evicted, the driver still has it.
	store, err := sandbox.OpenStore(filepath.Join(e.stateDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := store.List()
	if err != nil || len(recs) != 1 {
		t.Fatalf("records: %v %v", recs, err)
	}
	archive := filepath.Join(e.stateDir, "evicted", "s1")
	if err := os.MkdirAll(archive, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(archive, "f.txt"), []byte("from the archive"), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := recs[0]
	rec.State, rec.Archive = sandbox.Evicted, archive
	if err := store.Put(rec); err != nil {
		t.Fatal(err)
	}

	r = e.start()
	defer r.stop()
	if rs := refs(t, e.fake); len(rs) != 0 {
		t.Fatalf("the half-evicted sandbox is still there: %v", rs)
	}
	if hb := e.heartbeat(r); len(hb.Sandboxes) != 1 || hb.Sandboxes[0].State != pb.SandboxState_SANDBOX_STATE_EVICTED {
		t.Fatalf("heartbeat sandboxes = %v", hb.Sandboxes)
	}
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	got, err := e.sandboxClient().ReadFile(context.Background(), &pb.ReadFileRequest{Key: "s1", Path: "f.txt"})
	if err != nil || string(got.Data) != "from the archive" {
		t.Fatalf("restored file: %v %v", got, err)
	}
}
