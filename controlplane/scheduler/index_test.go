package scheduler_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
)

// ids lists the host ids of candidate lists, in order.
func ids(lists [][]*scheduler.Host) []string {
	var out []string
	for _, l := range lists {
		for _, h := range l {
			out = append(out, h.ID)
		}
	}
	return out
}

// The index files a host by its pool and providers while it is
// schedulable, follows it as it is relabelled or changes status, and
// forgets it when removed.
func TestIndexUpdates(t *testing.T) {
	a := labelled("a", "pool=p1,zone=z1")
	a.Providers = []string{"gvisor"}
	b := labelled("b", "pool=p1,zone=z2")
	b.Runtimes = []string{"runc"}
	c := labelled("c", "pool=p2,zone=z1")
	ix := scheduler.NewIndex(&a, &b)
	ix.Count("c", "t1", 2) // before c is filed: counted once it is
	ix.Update(&c)
	ix.Count("a", "t1", 1)
	ix.Count("b", "t1", 4)
	ix.Count("b", "t2", 1)
	zone := func(step, zone string, want int) {
		t.Helper()
		if got := ix.ZoneSandboxes(zone, "t1"); got != want {
			t.Errorf("%s: t1 has %d sandboxes in zone %q, want %d", step, got, zone, want)
		}
	}
	zone("added", "z1", 3)
	zone("added", "z2", 4)
	check := func(step string, pools []string, provider string, want ...string) {
		t.Helper()
		if got := ids(ix.Candidates(pools, provider)); !slices.Equal(got, want) {
			t.Errorf("%s: candidates of %v/%q = %v, want %v", step, pools, provider, got, want)
		}
	}
	check("added", []string{"p1"}, "", "a", "b")
	check("added", []string{"p1"}, "runsc", "a") // b's runtimes replaced runsc
	check("added", []string{"p1"}, "gvisor", "a")
	check("added", []string{"p1", "p2", "p1"}, "", "a", "b", "c")
	check("added", nil, "", "a", "b", "c")
	check("added", nil, "runc", "b")
	check("added", []string{""}, "")
	check("added", []string{"nope"}, "")

	// Relabel: c moves to p1 and zone z2, b loses its pool.
	c.Labels = map[string]string{scheduler.PoolLabel: "p1", scheduler.ZoneLabel: "z2"}
	ix.Update(&c)
	b.Labels = nil
	ix.Update(&b)
	check("relabelled", []string{"p1"}, "", "a", "c")
	check("relabelled", []string{"p2"}, "")
	check("relabelled", []string{""}, "runc", "b")
	zone("relabelled", "z1", 1)
	zone("relabelled", "z2", 2)
	zone("relabelled", "", 4)
	if got := ix.ZoneSandboxes("", "t2"); got != 1 {
		t.Errorf("t2 has %d sandboxes on hosts without a zone, want 1", got)
	}

	// Status: a host that is down, cordoned, draining or unhealthy is no
	// candidate, yet its sandboxes count in its zone (spread counts
	// them); back to health, it is a candidate again.
	for _, tc := range []struct {
		name string
		mut  func(h *scheduler.Host)
	}{
		{"down", func(h *scheduler.Host) { h.Status = scheduler.StatusDown }},
		{"cordoned", func(h *scheduler.Host) { h.Eligible = false }},
		{"draining", func(h *scheduler.Host) { h.Draining = true }},
		{"memory pressure", func(h *scheduler.Host) {
			h.Conditions = []scheduler.Condition{{Type: "memory_pressure", Reason: "2% available"}}
		}},
	} {
		was := a
		tc.mut(&a)
		ix.Update(&a)
		check(tc.name, []string{"p1"}, "", "c")
		zone(tc.name, "z1", 1)
		a = was
		ix.Update(&a)
		check(tc.name+", recovered", []string{"p1"}, "", "a", "c")
	}

	ix.Remove("a")
	ix.Remove("a") // twice: nothing more
	check("removed", []string{"p1"}, "", "c")
	check("removed", nil, "gvisor")
	zone("removed", "z1", 0)
	ix.Count("a", "t1", -1) // its sandbox goes too
	ix.Update(&a)
	zone("filed again", "z1", 0)
	ix.Count("c", "t1", -2)
	zone("released", "z2", 0)
}

// randomFleet is n hosts with every field the filters and scores read
// drawn from r: pools, zones, status, cordons, drains, conditions,
// runtimes, providers and their health, capacity, allocation, images,
// warm sandboxes and other labels.
func randomFleet(r *rand.Rand, n int) []scheduler.Host {
	pick := func(of ...string) string { return of[r.IntN(len(of))] }
	hosts := make([]scheduler.Host, n)
	for i := range hosts {
		h := schedulertest.Host(fmt.Sprintf("h%03d", r.IntN(10*n)), int64(1000+r.IntN(8000)), int64(1024+r.IntN(16384)))
		h.ID = fmt.Sprintf("%s-%d", h.ID, i) // unique, not in creation order
		h.Labels = map[string]string{}
		if p := pick("", "p0", "p1", "p2", "p3"); p != "" {
			h.Labels[scheduler.PoolLabel] = p
		}
		if z := pick("", "za", "zb", "zc"); z != "" {
			h.Labels[scheduler.ZoneLabel] = z
		}
		if r.IntN(3) == 0 {
			h.Labels["ssd"] = pick("yes", "no")
		}
		if r.IntN(8) == 0 {
			h.Status = scheduler.StatusDown
		}
		h.Eligible = r.IntN(8) != 0
		h.Draining = r.IntN(10) == 0
		if r.IntN(6) == 0 {
			h.Conditions = []scheduler.Condition{{Type: "disk_pressure", OK: r.IntN(2) == 0}}
		}
		h.Runtimes = []string{pick("runsc", "runc", "process")}
		if r.IntN(2) == 0 {
			h.Runtimes = append(h.Runtimes, pick("runsc", "runc", "process"))
		}
		for _, p := range []string{"gvisor", "runc", "process"} {
			if r.IntN(2) == 0 {
				h.Providers = append(h.Providers, p)
				if r.IntN(2) == 0 {
					h.Offers = append(h.Offers, scheduler.Provider{Name: p, Healthy: r.IntN(4) != 0})
				}
			}
		}
		h.Allocated = scheduler.Resources{CPUMillis: int64(r.IntN(int(h.Capacity.CPUMillis))), MemoryMiB: int64(r.IntN(int(h.Capacity.MemoryMiB)))}
		if r.IntN(3) == 0 {
			h.Images = []string{"py"}
		}
		if r.IntN(4) == 0 {
			h.Warm = map[string]int{scheduler.WarmKey("py", h.Runtimes[0]): 1}
		}
		hosts[i] = h
	}
	return hosts
}

// randomRequest draws a request: its pools (or none), runtime, provider,
// size, image, constraints, affinity and zone spread.
func randomRequest(r *rand.Rand, session string) scheduler.Request {
	pick := func(of ...string) string { return of[r.IntN(len(of))] }
	q := scheduler.Request{SessionID: session, Tenant: pick("t1", "t2", "t3"),
		Resources: scheduler.Resources{CPUMillis: int64(100 + r.IntN(1500)), MemoryMiB: int64(128 + r.IntN(2048))}}
	if r.IntN(4) != 0 {
		q.Runtime = pick("runsc", "runc", "process")
	}
	if r.IntN(3) == 0 {
		q.Provider = pick("gvisor", "runc", "process", "nobody")
	}
	if r.IntN(4) != 0 {
		for range 1 + r.IntN(3) {
			q.Pools = append(q.Pools, pick("", "p0", "p1", "p2", "p3", "p9"))
		}
	}
	if r.IntN(2) == 0 {
		q.Image = "py"
	}
	if r.IntN(4) == 0 {
		q.Constraints = []scheduler.Constraint{{Key: "ssd", Op: scheduler.OpEqual, Value: "yes"}}
	}
	if r.IntN(3) == 0 {
		q.Affinity = []scheduler.Affinity{{Key: scheduler.PoolLabel, Value: pick("p0", "p1"), Weight: scheduler.DedicatedWeight}}
	}
	q.SpreadZones = r.IntN(3) == 0
	return q
}

// Place over the index plans exactly what the full scan plans, the
// same host, score and error, over randomized fleets (seeded, so a
// failure repeats) as placements commit and hosts change.
func TestIndexedPlansMatchFullScan(t *testing.T) {
	const rounds, placesPerRound = 40, 60
	for seed := range uint64(rounds) {
		r := rand.New(rand.NewPCG(seed, 15))
		v := schedulertest.NewView(randomFleet(r, 20+r.IntN(120))...)
		v.TenantQuota = scheduler.Quota{HostSharePercent: []int{0, 30, 60}[r.IntN(3)]}
		cfg := scheduler.Config{}
		if r.IntN(2) == 0 {
			cfg = scheduler.DefaultConfig
			cfg.Strategy = scheduler.Spread
		}
		placed := 0
		for i := range placesPerRound {
			req := randomRequest(r, fmt.Sprintf("s%d-%d", seed, i))
			got, gotErr := scheduler.Place(v, req, cfg)
			want, wantErr := scheduler.Place(v.FullScan(), req, cfg)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d, request %d %+v:\nindexed   %+v, %v\nfull scan %+v, %v", seed, i, req, got, gotErr, want, wantErr)
			}
			if gotErr == nil && scheduler.Admit(v, got, v.TenantQuota) == nil {
				v.Commit(got)
				placed++
			}
			// Now and then a host changes: relabelled, drained,
			// brought back, taken ill or cured.
			if r.IntN(5) == 0 {
				hs := v.Hosts()
				h := hs[r.IntN(len(hs))]
				switch r.IntN(4) {
				case 0:
					h.Labels = map[string]string{scheduler.PoolLabel: fmt.Sprintf("p%d", r.IntN(4)), scheduler.ZoneLabel: "zc"}
				case 1:
					h.Draining = !h.Draining
				case 2:
					h.Status, h.Eligible, h.Conditions = scheduler.StatusReady, true, nil
				case 3:
					h.Conditions = []scheduler.Condition{{Type: "memory_pressure"}}
				}
				v.Index().Update(h)
			}
		}
		if placed == 0 {
			t.Errorf("seed %d: nothing placed; the comparison covered only refusals", seed)
		}
	}
}

// PlaceMove over the index plans exactly what it plans over the full
// scan, for placed sessions of randomized fleets, with and without a
// narrowing of the hosts a move may choose, and never plans a move back
// onto a host the narrowing refuses.
func TestIndexedMovesMatchFullScan(t *testing.T) {
	const rounds, placesPerRound = 30, 60
	moved := 0
	for seed := range uint64(rounds) {
		r := rand.New(rand.NewPCG(seed, 16))
		v := schedulertest.NewView(randomFleet(r, 20+r.IntN(120))...)
		cfg := scheduler.DefaultConfig
		if r.IntN(2) == 0 {
			cfg.Strategy = scheduler.Spread
		}
		var placed []scheduler.Request
		for i := range placesPerRound {
			req := randomRequest(r, fmt.Sprintf("s%d-%d", seed, i))
			if p, err := scheduler.Place(v, req, cfg); err == nil && scheduler.Admit(v, p, v.TenantQuota) == nil {
				v.Commit(p)
				placed = append(placed, req)
			}
		}
		for _, req := range placed {
			cur, _ := v.Placement(req.SessionID)
			var only func(*scheduler.Host) bool
			switch r.IntN(3) {
			case 0: // any host
			case 1:
				only = func(h *scheduler.Host) bool { return h.ID != cur.HostID }
			case 2:
				z := []string{"za", "zb", "zc"}[r.IntN(3)]
				only = func(h *scheduler.Host) bool { return h.Labels[scheduler.ZoneLabel] == z }
			}
			got, gotErr := scheduler.PlaceMove(v, req, cfg, only)
			want, wantErr := scheduler.PlaceMove(v.FullScan(), req, cfg, only)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d, move of %+v from %s:\nindexed   %+v, %v\nfull scan %+v, %v", seed, req, cur.HostID, got, gotErr, want, wantErr)
			}
			if gotErr != nil {
				continue
			}
			moved++
			if got.Existing {
				t.Fatalf("seed %d: a move of %s planned its existing placement", seed, req.SessionID)
			}
			if h, ok := v.Host(got.HostID); !ok || (only != nil && !only(h)) {
				t.Fatalf("seed %d: the move of %s chose %s, which the narrowing refuses", seed, req.SessionID, got.HostID)
			}
		}
	}
	if moved == 0 {
		t.Error("no move was planned; the comparison covered only refusals")
	}
}
