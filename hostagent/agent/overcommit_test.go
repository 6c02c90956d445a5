package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
