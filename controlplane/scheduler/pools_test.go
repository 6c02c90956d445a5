package scheduler_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// labelled is a host with labels (k=v,k=v).
func labelled(id, labels string) scheduler.Host {
	h := schedulertest.Host(id, 4000, 8192)
	h.Labels = map[string]string{}
	for kv := range strings.SplitSeq(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			h.Labels[k] = v
		}
	}
	return h
}

// acmeFleet is two shared hosts in zones a and b, one host dedicated to
// acme and one without a pool.
func acmeFleet() []scheduler.Host {
	return []scheduler.Host{
		labelled("shared-a", "pool=shared,zone=a"),
		labelled("shared-b", "pool=shared,zone=b"),
		labelled("dedicated", "pool=dedicated,zone=a"),
		labelled("plain", ""),
	}
}

// placements as policy placement.yaml would give them.
var (
	acme  = policy.Placement{Pools: []string{"", "dedicated", "shared"}, Dedicated: []string{"dedicated"}}
	other = policy.Placement{Pools: []string{"", "shared"}}
	bound = policy.Placement{Pools: []string{"dedicated"}, Dedicated: []string{"dedicated"}}
)

func placed(tenant string, pl policy.Placement, key string) scheduler.Request {
	r := req(key, func(r *scheduler.Request) { r.Tenant = tenant })
	r.ApplyPlacement(pl)
	return r
}

// The pool filter: a host's pool must be one the tenant may use; no pools
// on the request is any host.
func TestPoolFilter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		host  string // labels
		pools []string
		pass  bool
	}{
		{"no pools asked, any host", "pool=dedicated", nil, true},
		{"allowed pool", "pool=shared", []string{"", "shared"}, true},
		{"another tenant's pool", "pool=dedicated", []string{"", "shared"}, false},
		{"host without a pool, allowed", "", []string{"", "shared"}, true},
		{"host without a pool, bound tenant", "", []string{"dedicated"}, false},
		{"a pool policy does not define", "pool=gpu", []string{"", "shared"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := schedulertest.New(t, labelled("h", tc.host))
			_, err := h.Place(req("s", func(r *scheduler.Request) { r.Pools = tc.pools }))
			if tc.pass != (err == nil) {
				t.Fatalf("placing: %v, want pass %v", err, tc.pass)
			}
			var nf *scheduler.NoFitError
			if !tc.pass && (!errors.As(err, &nf) || nf.Rejected[scheduler.FilterPool] != 1) {
				t.Fatalf("refused by %v, want the pool filter", err)
			}
		})
	}
}

// Another tenant's sandbox never lands on a dedicated host, even when it
// is the only host with room or has a warm sandbox; acme's prefer theirs.
func TestDedicatedPool(t *testing.T) {
	h := schedulertest.New(t, acmeFleet()...)
	for i := range 4 { // the dedicated host's room
		p := h.MustPlace(placed("tenant_acme", acme, fmt.Sprintf("acme-%d", i)))
		if p.HostID != "dedicated" {
			t.Fatalf("acme-%d on %s, want its dedicated host while it has room", i, p.HostID)
		}
	}
	// Unbound, acme may use the shared hosts once its own is full.
	if p := h.MustPlace(placed("tenant_acme", acme, "acme-4")); p.HostID == "dedicated" {
		t.Fatal("acme-4 placed on a full host")
	}
	// The dedicated host is emptiest and has a warm sandbox: still refused.
	h = schedulertest.New(t, acmeFleet()...)
	d, _ := h.View.Host("dedicated")
	d.Warm = map[string]int{scheduler.WarmKey("img", "runsc"): 3}
	d.Images = []string{"img"}
	for _, hid := range []string{"shared-a", "shared-b", "plain"} {
		hh, _ := h.View.Host(hid)
		hh.Allocated = scheduler.Resources{CPUMillis: 2000, MemoryMiB: 4096}
	}
	for i := range 12 {
		r := placed("tenant_other", other, fmt.Sprintf("other-%d", i))
		r.Image = "img"
		p, err := h.Place(r)
		if scheduler.IsNoFit(err) {
			break // the other hosts are full
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.HostID == "dedicated" {
			t.Fatalf("other-%d placed on acme's dedicated host", i)
		}
		if err := h.Commit(p); err != nil {
			t.Fatal(err)
		}
	}
	_, err := h.Place(placed("tenant_other", other, "one-more"))
	var nf *scheduler.NoFitError
	if !errors.As(err, &nf) || nf.Rejected[scheduler.FilterPool] != 1 {
		t.Fatalf("with the shared hosts full: %v, want no fit with the dedicated host refused by pool", err)
	}
	if !strings.Contains(err.Error(), "in the pools its tenant may use (hosts without a pool, shared)") {
		t.Fatalf("the refusal does not name the pools: %v", err)
	}
}

// A tenant bound to its dedicated pool only waits when that pool is full
// (or draining), with an error naming the pool; it never spills over.
func TestBoundTenantDoesNotSpill(t *testing.T) {
	h := schedulertest.New(t, acmeFleet()...)
	d, _ := h.View.Host("dedicated")
	d.Draining = true
	_, err := h.Place(placed("tenant_acme", bound, "s"))
	var nf *scheduler.NoFitError
	if !errors.As(err, &nf) || nf.Rejected[scheduler.FilterDraining] != 1 || nf.Rejected[scheduler.FilterPool] != 3 {
		t.Fatalf("bound to a draining pool: %v", err)
	}
	if !strings.Contains(err.Error(), "in the pools its tenant may use (dedicated)") {
		t.Fatalf("the refusal does not name the pool: %v", err)
	}
}

// The commit checks the pool again: a host that re-registered into
// another pool between plan and commit is a conflict (the FSM re-plans).
func TestValidateChecksPool(t *testing.T) {
	h := schedulertest.New(t, acmeFleet()...)
	p, err := h.Place(placed("tenant_other", other, "s"))
	if err != nil {
		t.Fatal(err)
	}
	moved := labelled(p.HostID, "pool=dedicated")
	h.View.AddHost(moved)
	if err := h.Commit(p); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "pool") {
		t.Fatalf("commit onto a host now dedicated: %v, want a conflict naming the pool filter", err)
	}
}

// With spread_zones a tenant's sandboxes alternate between the zones; the
// bin-packer alone puts them on one host.
func TestSpreadZones(t *testing.T) {
	fleet := []scheduler.Host{
		labelled("a1", "pool=shared,zone=a"), labelled("a2", "pool=shared,zone=a"),
		labelled("b1", "pool=shared,zone=b"), labelled("c1", "pool=shared,zone=c"),
	}
	spread := policy.Placement{Pools: []string{"shared"}, SpreadZones: true}
	h := schedulertest.New(t, fleet...)
	zones := map[string]int{}
	for i := range 9 {
		p := h.MustPlace(placed("t1", spread, fmt.Sprintf("s%d", i)))
		hh, _ := h.View.Host(p.HostID)
		zones[hh.Labels[scheduler.ZoneLabel]]++
	}
	if zones["a"] != 3 || zones["b"] != 3 || zones["c"] != 3 {
		t.Fatalf("9 sandboxes over 3 zones: %v, want 3 each", zones)
	}
	// Another tenant's sandboxes do not count: its first goes anywhere
	// the score says (here: the fullest host, bin-packing).
	p := h.MustPlace(placed("t2", spread, "t2-0"))
	if p.HostID == "" {
		t.Fatal("no host")
	}
	// Without spread, bin-packing fills one host.
	h = schedulertest.New(t, fleet...)
	for i := range 3 {
		if p := h.MustPlace(placed("t1", policy.Placement{Pools: []string{"shared"}}, fmt.Sprintf("s%d", i))); p.HostID != "a1" {
			t.Fatalf("bin-packing put s%d on %s, want a1", i, p.HostID)
		}
	}
	// A zone whose hosts cannot take the request is not waited for: the
	// least-loaded zone among those that can wins.
	h = schedulertest.New(t, fleet...)
	for _, id := range []string{"b1", "c1"} {
		hh, _ := h.View.Host(id)
		hh.Draining = true
	}
	for i := range 3 {
		if p := h.MustPlace(placed("t1", spread, fmt.Sprintf("s%d", i))); p.HostID[0] != 'a' {
			t.Fatalf("s%d on %s with zones b and c draining", i, p.HostID)
		}
	}
}

// Affinity: a session that has a placement keeps it, even when another
// host has become the better choice (an emptier one, its dedicated pool).
func TestPlacedSessionStays(t *testing.T) {
	h := schedulertest.New(t, acmeFleet()...)
	d, _ := h.View.Host("dedicated")
	d.Draining = true
	first := h.MustPlace(placed("tenant_acme", acme, "s"))
	if first.HostID == "dedicated" {
		t.Fatal("placed on a draining host")
	}
	d.Draining = false
	again, err := h.Place(placed("tenant_acme", acme, "s"))
	if err != nil || !again.Existing || again.HostID != first.HostID {
		t.Fatalf("placing again: %+v %v, want the existing placement on %s", again, err, first.HostID)
	}
}

func TestApplyPlacementIsIdempotent(t *testing.T) {
	r := req("s", func(r *scheduler.Request) {
		r.Affinity = []scheduler.Affinity{{Key: "ssd", Value: "yes", Weight: 5}}
	})
	r.ApplyPlacement(acme)
	r.ApplyPlacement(acme)
	if len(r.Affinity) != 2 || r.Affinity[0].Key != "ssd" || r.Affinity[1].Value != "dedicated" {
		t.Fatalf("affinity after applying twice: %+v", r.Affinity)
	}
	r.ApplyPlacement(policy.Placement{})
	if r.Pools != nil || len(r.Affinity) != 1 {
		t.Fatalf("after applying no pools: %+v", r)
	}
}

// BenchmarkPlace1000HostsInPools is BenchmarkPlace1000Hosts over hosts in
// 10 pools and 10 zones: without a pool filter, with the tenant allowed 3
// pools, and with zone spread too (a second pass over the hosts).
func BenchmarkPlace1000HostsInPools(b *testing.B) {
	hosts := schedulertest.Fleet(1000, 64000, 65536)
	for i := range hosts {
		hosts[i].Labels = map[string]string{scheduler.PoolLabel: fmt.Sprintf("p%d", i%10), scheduler.ZoneLabel: fmt.Sprintf("z%d", i/100)}
	}
	for _, bc := range []struct {
		name string
		pl   policy.Placement
	}{
		{"no_pools", policy.Placement{}},
		{"3_of_10_pools", policy.Placement{Pools: []string{"p1", "p4", "p7"}}},
		{"3_of_10_pools_spread", policy.Placement{Pools: []string{"p1", "p4", "p7"}, SpreadZones: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := schedulertest.New(b, hosts...)
			r := placed("t1", bc.pl, "s")
			r.Image = "py"
			for b.Loop() {
				if _, err := scheduler.Place(h.View, r, h.Config); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
