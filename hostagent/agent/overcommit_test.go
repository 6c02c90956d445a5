package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The host admits sandboxes by their requests, against what the control
// plane says it schedules against here (its allocatable resources times
// the overcommit ratios), so that the two checks agree; each sandbox
// still gets its whole limit. Without a request (an older control plane)
// a sandbox's limits count, as before.
func TestEnsureAdmitsRequestsAgainstSchedulable(t *testing.T) {
	e := setup(t)
	e.allocatable = agent.Resources{CPUMillis: 4000, MemoryBytes: 4 << 30}
	// The control plane schedules 10x the CPU here: 40 sandboxes that
	// request 1000m (4 by the host's own allocatable).
	e.ctl.SetSchedulable(&pb.Resources{CpuMillis: 40000, MemoryBytes: 4 << 30})
	r := e.start()
	defer r.stop()
	ensure := func(key string, request *pb.Resources) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: key, Image: "img", Runtime: "fake",
			Limits: &pb.Limits{CpuMillis: 2000, MemoryBytes: 512 << 20}, Request: request})
		return err
	}
	small := &pb.Resources{CpuMillis: 1000, MemoryBytes: 64 << 20}
	for i := range 40 {
		if err := ensure(fmt.Sprintf("s%02d", i), small); err != nil {
			t.Fatalf("sandbox %d of 40: %v", i, err)
		}
	}
	err := ensure("s40", small)
	if errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), "CPU") || !strings.Contains(err.Error(), "of 40000 schedulable") {
		t.Fatalf("the 41st: %v, want resource exhausted about CPU against 40000m", err)
	}
	if hb := e.heartbeat(r); hb.Allocated.GetCpuMillis() != 40000 || hb.Allocated.GetMemoryBytes() != 40*64<<20 {
		t.Fatalf("heartbeat allocated %v, want the sum of the requests", hb.Allocated)
	}
	for _, sb := range e.heartbeat(r).Sandboxes {
		if sb.Limits.GetCpuMillis() != 2000 {
			t.Fatalf("sandbox %s limits %v, want its whole limit", sb.Key, sb.Limits)
		}
	}
}

// Without a request the limits are what a sandbox reserves.
func TestEnsureWithoutRequestReservesLimits(t *testing.T) {
	e := setup(t)
	e.allocatable = agent.Resources{CPUMillis: 4000, MemoryBytes: 4 << 30}
	r := e.start()
	defer r.stop()
	for i := range 4 {
		if _, err := e.ensure(fmt.Sprintf("s%d", i), &pb.Limits{CpuMillis: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.ensure("s4", &pb.Limits{CpuMillis: 1000}); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Fatalf("a fifth 1000m sandbox on a 4000m host: %v", err)
	}
}

// A paused sandbox reserves only the host disk it holds, as its driver
// measured it at the pause (it cannot grow while paused), so another
// sandbox fits in the rest of its disk request; resuming it needs its
// whole request again, and is refused while that does not fit.
func TestPausedSandboxReservesTheDiskItHolds(t *testing.T) {
	e := setup(t)
	// Two requests of 1 GiB, and room for what a paused one holds.
	e.allocatable = agent.Resources{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 2<<30 + 1<<20}
	r := e.start()
	defer r.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ensure := func(key string) error {
		_, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: key, Image: "img", Runtime: "fake",
			Limits: &pb.Limits{CpuMillis: 1000, MemoryBytes: 512 << 20, DiskBytes: 1 << 30}, Request: &pb.Resources{CpuMillis: 100, MemoryBytes: 64 << 20, DiskBytes: 1 << 30}})
		return err
	}
	for _, key := range []string{"s1", "s2"} {
		if err := ensure(key); err != nil {
			t.Fatal(err)
		}
	}
	if err := ensure("s3"); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("a third 1 GiB sandbox on a 2 GiB disk: %v, want resource exhausted about disk", err)
	}
	c := e.sandboxClient()
	if out, res, err := execStream(t, c, "s1", "echo", "one"); err != nil || res.ExitCode != 0 || out != "one\n" {
		t.Fatalf("exec: %q %v %v", out, res, err)
	}
	paused, err := c.Pause(ctx, &pb.PauseRequest{Key: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	held := paused.GetDiskBytes()
	if held <= 0 || held > 1<<20 {
		t.Fatalf("Pause says the paused sandbox holds %d bytes; want some, at most the 1 MiB left of the disk", held)
	}
	if again, err := c.Pause(ctx, &pb.PauseRequest{Key: "s1"}); err != nil || again.GetDiskBytes() != held {
		t.Fatalf("pausing a paused sandbox: %v, %v; want the same %d bytes", again, err, held)
	}
	if hb := e.heartbeat(r); hb.Allocated.GetDiskBytes() != 1<<30+held {
		t.Fatalf("heartbeat allocated disk %d, want s2's request and what s1 holds (%d)", hb.Allocated.GetDiskBytes(), 1<<30+held)
	}
	if err := ensure("s3"); err != nil {
		t.Fatalf("a 1 GiB sandbox beside a paused one: %v", err)
	}
	if _, err := c.Resume(ctx, &pb.ResumeRequest{Key: "s1"}); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("resuming s1 without room for its disk request: %v, want resource exhausted about disk", err)
	}
	if err := e.ctl.Destroy(ctx, hostID, "s3"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, &pb.ResumeRequest{Key: "s1"}); err != nil {
		t.Fatalf("resuming s1 once s3 is gone: %v", err)
	}
	if hb := e.heartbeat(r); hb.Allocated.GetDiskBytes() != 2<<30 {
		t.Fatalf("heartbeat allocated disk %d after the resume, want both whole requests", hb.Allocated.GetDiskBytes())
	}
}
