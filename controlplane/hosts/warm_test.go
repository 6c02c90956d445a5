package hosts_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/test/fleettest"
)

// TestWarmPoolMovesPlacementsGVisor: of two gVisor hosts, the one whose
// warm pool holds the session's class gets the placement (by id and by
// bin-packing the other would), its heartbeats having put the count in
// the FSM; the session's sandbox is the pooled one, and the claim's refill
// reaches the FSM again.
func TestWarmPoolMovesPlacementsGVisor(t *testing.T) {
	const image = "localhost/corral/busybox:1"
	res := scheduler.Resources{CPUMillis: 500, MemoryMiB: 256}
	drivers := map[string]*containerd.Driver{}
	var order []string
	c := fleettest.Start(t, fleettest.Options{Runtime: containerd.RuntimeGVisor, Image: image, Resources: res,
		NewDriver: func(t testing.TB) driver.Driver {
			d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
			drivers[order[len(drivers)]] = d
			return d
		}})
	order = []string{"h-a-cold", "h-b-warm"}
	c.StartHost("h-a-cold", fleettest.HostOptions{})
	c.StartHost("h-b-warm", fleettest.HostOptions{Pools: []agent.PoolClass{{Image: image, Min: 1, Max: 1,
		Limits: driver.Limits{CPUMillis: res.CPUMillis, MemoryBytes: res.MemoryMiB << 20}}}})
	l := c.Leader()
	key := scheduler.WarmKey(image, containerd.RuntimeGVisor)
	ctx, cancel := context.WithTimeout(c.Ctx(), 2*time.Minute)
	defer cancel()
	warm := func(n int) {
		t.Helper()
		if err := c.Node(l).Wait(ctx, func(v raftfsm.View) bool { h, ok := v.Host("h-b-warm"); return ok && h.Warm[key] == n }); err != nil {
			t.Fatalf("waiting for h-b-warm's warm count %d in the FSM: %v (host %+v)", n, err, c.HostRecord(l, "h-b-warm"))
		}
	}
	warm(1)
	pooled := func() []string {
		var ids []string
		rs, err := drivers["h-b-warm"].List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.Labels[driver.PoolLabel] != "" {
				ids = append(ids, r.ID)
			}
		}
		return ids
	}
	before := pooled()
	p, err := c.Fleet(l).Place(ctx, scheduler.Request{SessionID: "sesn_warm", Tenant: string(fleettest.Tenant),
		Runtime: containerd.RuntimeGVisor, Image: image, Resources: res})
	if err != nil {
		t.Fatal(err)
	}
	if p.HostID != "h-b-warm" {
		t.Fatalf("placed on %s, want h-b-warm, the host with a warm sandbox of the class", p.HostID)
	}
	if err := c.Node(l).Wait(ctx, func(v raftfsm.View) bool { p, _ := v.Placement("sesn_warm"); return p.Ready }); err != nil {
		t.Fatal(err)
	}
	rs, err := drivers["h-b-warm"].List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idx := slices.IndexFunc(rs, func(r driver.Ref) bool { return r.Key == "sesn_warm" })
	if idx < 0 || !slices.Contains(before, rs[idx].ID) {
		t.Fatalf("the session's sandbox is not the pooled one %v: %v", before, rs)
	}
	warm(1) // refilled, and reported
	// The cluster's cleanup releases the session and destroys its sandbox.
}
