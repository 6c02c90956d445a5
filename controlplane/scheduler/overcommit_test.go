package scheduler_test

import (
	"errors"
	"fmt"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

func TestOvercommitApply(t *testing.T) {
	offered := scheduler.Resources{CPUMillis: 2000, MemoryMiB: 24 << 10, DiskMiB: 250 << 10}
	tests := []struct {
		name string
		o    scheduler.Overcommit
		want scheduler.Resources
	}{
		{"none", scheduler.Overcommit{}, offered},
		{"ones", scheduler.Overcommit{CPU: 1, Memory: 1, Disk: 1}, offered},
		{"cpu and memory", scheduler.Overcommit{CPU: 10, Memory: 1.5, Disk: 1},
			scheduler.Resources{CPUMillis: 20000, MemoryMiB: 36 << 10, DiskMiB: 250 << 10}},
		{"rounds down", scheduler.Overcommit{CPU: 1.0005}, scheduler.Resources{CPUMillis: 2001, MemoryMiB: 24 << 10, DiskMiB: 250 << 10}},
		{"below one is none", scheduler.Overcommit{Memory: 0.5}, offered},
	}
	for _, tt := range tests {
		if got := tt.o.Apply(offered); got != tt.want {
			t.Errorf("%s: Apply = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestCheckHostShare(t *testing.T) {
	capacity := scheduler.Resources{CPUMillis: 20000, MemoryMiB: 36 << 10, DiskMiB: 100 << 10}
	small := scheduler.Resources{CPUMillis: 100, MemoryMiB: 64, DiskMiB: 1024}
	tests := []struct {
		name    string
		onHost  scheduler.Resources
		percent int
		r       scheduler.Resources
		ok      bool
	}{
		{"no bound", scheduler.Resources{CPUMillis: 19900}, 0, small, true},
		{"100 is no bound", scheduler.Resources{CPUMillis: 19900}, 100, small, true},
		{"within", scheduler.Resources{CPUMillis: 9800, MemoryMiB: 64, DiskMiB: 1024}, 50, small, true},
		{"exactly the share", scheduler.Resources{CPUMillis: 9900, MemoryMiB: 64, DiskMiB: 1024}, 50, small, true},
		{"cpu over", scheduler.Resources{CPUMillis: 9950, MemoryMiB: 64, DiskMiB: 1024}, 50, small, false},
		{"memory over", scheduler.Resources{CPUMillis: 100, MemoryMiB: 18 << 10, DiskMiB: 1024}, 50, small, false},
		{"disk over", scheduler.Resources{CPUMillis: 100, MemoryMiB: 64, DiskMiB: 50 << 10}, 50, small, false},
		// A tenant new to the host always gets its first sandbox there,
		// even one above the share of a small host.
		{"first one", scheduler.Resources{}, 10, scheduler.Resources{CPUMillis: 4000}, true},
		{"second big one", scheduler.Resources{CPUMillis: 4000}, 10, scheduler.Resources{CPUMillis: 4000}, false},
		{"unset capacity is not bounded", scheduler.Resources{CPUMillis: 100}, 50, scheduler.Resources{CPUMillis: 100}, true},
	}
	for _, tt := range tests {
		c := capacity
		if tt.name == "unset capacity is not bounded" {
			c = scheduler.Resources{MemoryMiB: 1024}
		}
		err := scheduler.CheckHostShare(tt.onHost, c, tt.percent, tt.r)
		if (err == nil) != tt.ok {
			t.Errorf("%s: CheckHostShare = %v, want ok %v", tt.name, err, tt.ok)
		}
		if err != nil && errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
			t.Errorf("%s: error kind %v, want resource exhausted", tt.name, errdefs.KindOf(err))
		}
	}
}

// shipped is the shipped policy's gvisor request and limits, its
// overcommit, and its default quota.
func shipped(t *testing.T) (request, limits scheduler.Resources, o scheduler.Overcommit, q scheduler.Quota) {
	t.Helper()
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	rt := p.Runtimes["gvisor"]
	request = scheduler.Resources{CPUMillis: int64(rt.CPURequest()), MemoryMiB: int64(rt.MemoryRequest()), DiskMiB: int64(rt.DiskMiB)}
	limits = scheduler.Resources{CPUMillis: int64(rt.CPUMillis), MemoryMiB: int64(rt.MemoryMiB), DiskMiB: int64(rt.DiskMiB)}
	return request, limits, scheduler.OvercommitFromPolicy(p.Overcommit), scheduler.QuotaFromPolicy(p.DefaultQuota)
}

// devHost is a 2-core, 24 GiB host with 250 GiB of disk (this machine)
// under the overcommit o.
func devHost(id string, o scheduler.Overcommit) scheduler.Host {
	h := schedulertest.Host(id, 2000, 24<<10)
	h.Offered = scheduler.Resources{CPUMillis: 2000, MemoryMiB: 24 << 10, DiskMiB: 250 << 10}
	h.Capacity = o.Apply(h.Offered)
	return h
}

// With the shipped policy a 2-core host takes at least 50 sessions'
// sandboxes (here: 200, by CPU), each with its whole limit; with the
// requests equal to the limits and no overcommit it took 2.
func TestRequestsAndOvercommitAdmit(t *testing.T) {
	request, limits, o, q := shipped(t)
	q.ConcurrentSandboxes, q.CPUMillis, q.MemoryMiB = 0, 0, 0 // only the host's room counts here
	tests := []struct {
		name    string
		o       scheduler.Overcommit
		request scheduler.Resources
		tenants int
		want    int
	}{
		{"limits reserved, no overcommit (before)", scheduler.Overcommit{}, limits, 8, 2},
		{"requests, no overcommit", scheduler.Overcommit{}, request, 8, 20},
		{"shipped policy", o, request, 8, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := schedulertest.New(t, devHost("h", tt.o))
			h.Quota = q
			placed := 0
			for i := range 1000 {
				r := scheduler.Request{SessionID: fmt.Sprintf("s%04d", i), Tenant: fmt.Sprintf("t%d", i%tt.tenants),
					Runtime: "runsc", Resources: tt.request, Limits: limits}
				p, err := h.Place(r)
				if scheduler.IsNoFit(err) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if p.Limits != limits || p.Resources != tt.request {
					t.Fatalf("plan reserves %+v with limits %+v, want %+v and %+v", p.Resources, p.Limits, tt.request, limits)
				}
				if err := h.Commit(p); err != nil {
					t.Fatal(err)
				}
				placed++
			}
			if placed != tt.want {
				t.Fatalf("placed %d sandboxes on a 2-core host, want %d", placed, tt.want)
			}
		})
	}
}

// One tenant's sandboxes fill at most its share of a host: another
// tenant's session is still placed there, and the first tenant's next one
// is refused by the tenant_share filter (not for lack of room).
func TestTenantShareLeavesRoomForOthers(t *testing.T) {
	request, limits, o, q := shipped(t)
	q.ConcurrentSandboxes, q.CPUMillis, q.MemoryMiB = 0, 0, 0
	h := schedulertest.New(t, devHost("h", o))
	h.Quota = q
	mk := func(key, tenant string) scheduler.Request {
		return scheduler.Request{SessionID: key, Tenant: tenant, Runtime: "runsc", Resources: request, Limits: limits}
	}
	a := 0
	for i := range 1000 {
		p, err := h.Place(mk(fmt.Sprintf("a%04d", i), "tenant_a"))
		if err != nil {
			var nf *scheduler.NoFitError
			if !errors.As(err, &nf) || nf.Rejected[scheduler.FilterTenantShare] != 1 {
				t.Fatalf("tenant a's sandbox %d: %v, want a tenant_share rejection", i, err)
			}
			break
		}
		if err := h.Commit(p); err != nil {
			t.Fatal(err)
		}
		a++
	}
	if a != 100 { // 50% of 20000m at 100m each
		t.Fatalf("tenant a placed %d, want 100 (half the host)", a)
	}
	for i := range 100 {
		h.MustPlace(mk(fmt.Sprintf("b%04d", i), "tenant_b"))
	}
	// The commit-time check refuses a plan past the share made from a
	// stale view, as it refuses one past the host's room.
	stale := scheduler.Plan{SessionID: "a-stale", Tenant: "tenant_a", HostID: "h", Resources: request}
	if err := scheduler.Validate(h.View, stale); !errdefs.IsConflict(err) {
		t.Fatalf("a plan past tenant a's share: %v, want a conflict", err)
	}
}

func TestLimitsBelowRequestRefused(t *testing.T) {
	h := schedulertest.New(t, host("h", nil))
	r := req("s", func(r *scheduler.Request) {
		r.Limits = scheduler.Resources{CPUMillis: 500, MemoryMiB: 1024, DiskMiB: 1024}
	})
	if _, err := h.Place(r); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("limits below the request: %v, want invalid argument", err)
	}
	p := scheduler.Plan{SessionID: "s", Tenant: "t1", HostID: "h", Resources: r.Resources, Limits: r.Limits}
	if err := scheduler.Validate(h.View, p); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a plan with limits below its request: %v, want invalid argument", err)
	}
}
