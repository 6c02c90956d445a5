package scheduler_test

import (
	"errors"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

func host(id string, mut func(*scheduler.Host)) scheduler.Host {
	h := schedulertest.Host(id, 4000, 8192)
	if mut != nil {
		mut(&h)
	}
	return h
}

func req(key string, mut func(*scheduler.Request)) scheduler.Request {
	r := scheduler.Request{SessionID: key, Tenant: "t1", Runtime: "runsc",
		Resources: scheduler.Resources{CPUMillis: 1000, MemoryMiB: 1024, DiskMiB: 1024}}
	if mut != nil {
		mut(&r)
	}
	return r
}

func TestFilters(t *testing.T) {
	ok := host("z-ok", nil) // sorts last, so only the filter can make it lose
	tests := []struct {
		name   string
		bad    scheduler.Host
		req    scheduler.Request
		filter scheduler.Filter
	}{
		{"down", host("a", func(h *scheduler.Host) { h.Status = scheduler.StatusDown }), req("s", nil), scheduler.FilterReady},
		{"cordoned", host("a", func(h *scheduler.Host) { h.Eligible = false }), req("s", nil), scheduler.FilterEligible},
		{"draining", host("a", func(h *scheduler.Host) { h.Draining = true }), req("s", nil), scheduler.FilterDraining},
		{"runtime", host("a", func(h *scheduler.Host) { h.Runtimes = []string{"runc"} }), req("s", nil), scheduler.FilterRuntime},
		{"provider", host("a", nil), req("s", func(r *scheduler.Request) { r.Provider = "gpu" }), scheduler.FilterProvider},
		{"memory pressure", host("a", func(h *scheduler.Host) {
			h.Conditions = []scheduler.Condition{{Type: "containerd_reachable", OK: true}, {Type: "memory_pressure", Reason: "3% available"}}
		}), req("s", nil), scheduler.FilterHealthy},
		{"disk pressure", host("a", func(h *scheduler.Host) { h.Conditions = []scheduler.Condition{{Type: "disk_pressure"}} }), req("s", nil), scheduler.FilterHealthy},
		{"containerd unreachable", host("a", func(h *scheduler.Host) { h.Conditions = []scheduler.Condition{{Type: "containerd_reachable"}} }), req("s", nil), scheduler.FilterHealthy},
		{"no heartbeat", host("a", func(h *scheduler.Host) {
			h.Conditions = []scheduler.Condition{{Type: scheduler.ConditionHeartbeat, Reason: "none for 30s"}}
		}), req("s", nil), scheduler.FilterHealthy},
		{"provider canary", host("a", func(h *scheduler.Host) {
			h.Offers = []scheduler.Provider{{Name: "runsc", Healthy: false, Reason: "canary: runsc --version exited 1"}}
		}), req("s", nil), scheduler.FilterProviderHealthy},
		{"no limited network", host("a", func(h *scheduler.Host) {
			h.Offers = []scheduler.Provider{{Name: "runsc", Healthy: true, NetworkModes: []string{"none"}}}
		}), req("s", func(r *scheduler.Request) { r.AllowedHosts = []string{"pypi.org"} }), scheduler.FilterNetwork},
		{"cpu", host("a", func(h *scheduler.Host) { h.Allocated.CPUMillis = 3500 }), req("s", nil), scheduler.FilterResources},
		{"memory", host("a", func(h *scheduler.Host) { h.Allocated.MemoryMiB = 8000 }), req("s", nil), scheduler.FilterResources},
		{"disk", host("a", func(h *scheduler.Host) { h.Capacity.DiskMiB = 10 }), req("s", nil), scheduler.FilterResources},
		{"label equal", host("a", func(h *scheduler.Host) { h.Labels = map[string]string{"zone": "b"} }),
			req("s", func(r *scheduler.Request) {
				r.Constraints = []scheduler.Constraint{{Key: "zone", Op: scheduler.OpEqual, Value: "a"}}
			}), scheduler.FilterLabels},
		{"label not equal", host("a", func(h *scheduler.Host) { h.Labels = map[string]string{"zone": "a"} }),
			req("s", func(r *scheduler.Request) {
				r.Constraints = []scheduler.Constraint{{Key: "zone", Op: scheduler.OpNotEqual, Value: "a"}}
			}), scheduler.FilterLabels},
		{"label exists", host("a", nil),
			req("s", func(r *scheduler.Request) {
				r.Constraints = []scheduler.Constraint{{Key: "ssd", Op: scheduler.OpExists}}
			}), scheduler.FilterLabels},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			good := ok
			if tt.req.Provider != "" {
				good.Providers = []string{tt.req.Provider}
			}
			good.Labels = map[string]string{"zone": "a", "ssd": "yes"}
			if len(tt.req.AllowedHosts) > 0 {
				good.Offers = []scheduler.Provider{{Name: "runsc", Healthy: true, NetworkModes: []string{"none", "limited"}}}
			}
			if tt.name == "label not equal" {
				good.Labels = map[string]string{"zone": "c"}
			}
			// With the good host present, the bad one is never chosen.
			h := schedulertest.New(t, tt.bad, good)
			p, err := h.Place(tt.req)
			if err != nil {
				t.Fatalf("place: %v", err)
			}
			if p.HostID != good.ID {
				t.Fatalf("placed on %s, want %s", p.HostID, good.ID)
			}
			if len(p.AllowedHosts) != len(tt.req.AllowedHosts) {
				t.Fatalf("the plan's allowed hosts %v, want the request's %v", p.AllowedHosts, tt.req.AllowedHosts)
			}
			// Alone, the bad host is rejected by exactly the expected filter.
			h = schedulertest.New(t, tt.bad)
			_, err = h.Place(tt.req)
			var nf *scheduler.NoFitError
			if !errors.As(err, &nf) {
				t.Fatalf("err = %v, want NoFitError", err)
			}
			if nf.Considered != 1 || nf.Rejected[tt.filter] != 1 || len(nf.Rejected) != 1 {
				t.Fatalf("rejections %v of %d, want 1 by %s", nf.Rejected, nf.Considered, tt.filter)
			}
			if errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), string(tt.filter)+": 1") {
				t.Fatalf("err %q kind %v", err, errdefs.KindOf(err))
			}
		})
	}
}

func TestNoFitCountsEveryFilter(t *testing.T) {
	h := schedulertest.New(t,
		host("a", func(h *scheduler.Host) { h.Status = scheduler.StatusDown }),
		host("b", func(h *scheduler.Host) { h.Status = scheduler.StatusDown }),
		host("c", func(h *scheduler.Host) { h.Draining = true }),
		host("d", func(h *scheduler.Host) { h.Allocated.CPUMillis = 4000 }),
	)
	_, err := h.Place(req("s", nil))
	var nf *scheduler.NoFitError
	if !errors.As(err, &nf) {
		t.Fatalf("err = %v", err)
	}
	want := map[scheduler.Filter]int{scheduler.FilterReady: 2, scheduler.FilterDraining: 1, scheduler.FilterResources: 1}
	if len(nf.Rejected) != len(want) {
		t.Fatalf("rejected %v, want %v", nf.Rejected, want)
	}
	for f, n := range want {
		if nf.Rejected[f] != n {
			t.Fatalf("rejected %v, want %v", nf.Rejected, want)
		}
	}
	if len(h.Plans) != 0 {
		t.Fatalf("recorded %d plans for a failed placement", len(h.Plans))
	}
}

func TestScores(t *testing.T) {
	warm := func(h *scheduler.Host) { h.Warm = map[string]int{scheduler.WarmKey("py", "runsc"): 1} }
	image := func(h *scheduler.Host) { h.Images = []string{"py"} }
	half := func(h *scheduler.Host) { h.Allocated = scheduler.Resources{CPUMillis: 2000, MemoryMiB: 4096} }
	withImage := func(r *scheduler.Request) { r.Image = "py" }
	tests := []struct {
		name  string
		cfg   scheduler.Config
		hosts []scheduler.Host
		req   scheduler.Request
		want  string
	}{
		{"warm beats image", scheduler.Config{}, []scheduler.Host{host("a", image), host("b", warm)}, req("s", withImage), "b"},
		{"warm needs matching runtime", scheduler.Config{}, []scheduler.Host{host("a", image),
			host("b", func(h *scheduler.Host) { h.Warm = map[string]int{scheduler.WarmKey("py", "runc"): 1} })}, req("s", withImage), "a"},
		{"zero warm count is not warm", scheduler.Config{}, []scheduler.Host{host("a", image),
			host("b", func(h *scheduler.Host) { h.Warm = map[string]int{scheduler.WarmKey("py", "runsc"): 0} })}, req("s", withImage), "a"},
		{"warm beats binpack", scheduler.Config{}, []scheduler.Host{host("a", half), host("b", warm)}, req("s", withImage), "b"},
		{"warm beats image and fit together", scheduler.Config{}, []scheduler.Host{host("a", func(h *scheduler.Host) { half(h); image(h) }), host("b", warm)}, req("s", withImage), "b"},
		{"warm of another image is not warm", scheduler.Config{}, []scheduler.Host{host("a", half),
			host("b", func(h *scheduler.Host) { h.Warm = map[string]int{scheduler.WarmKey("go", "runsc"): 3} })}, req("s", withImage), "a"},
		{"image beats fit", scheduler.Config{}, []scheduler.Host{host("a", half), host("b", image)}, req("s", withImage), "b"},
		{"binpack prefers fuller", scheduler.Config{Strategy: scheduler.BinPack, FitWeight: 1000}, []scheduler.Host{host("a", nil), host("b", half)}, req("s", nil), "b"},
		{"spread prefers emptier", scheduler.Config{Strategy: scheduler.Spread, FitWeight: 1000}, []scheduler.Host{host("a", half), host("b", nil)}, req("s", nil), "b"},
		{"affinity", scheduler.Config{}, []scheduler.Host{host("a", nil), host("b", func(h *scheduler.Host) { h.Labels = map[string]string{"zone": "x"} })},
			req("s", func(r *scheduler.Request) { r.Affinity = []scheduler.Affinity{{Key: "zone", Value: "x", Weight: 10}} }), "b"},
		{"anti-affinity", scheduler.Config{}, []scheduler.Host{host("a", func(h *scheduler.Host) { h.Labels = map[string]string{"zone": "x"} }), host("b", nil)},
			req("s", func(r *scheduler.Request) { r.Affinity = []scheduler.Affinity{{Key: "zone", Value: "x", Weight: -10}} }), "b"},
		{"tie goes to lowest id", scheduler.Config{}, []scheduler.Host{host("c", nil), host("a", nil), host("b", nil)}, req("s", nil), "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := schedulertest.New(t, tt.hosts...)
			h.Config = tt.cfg
			p, err := h.Place(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if p.HostID != tt.want {
				t.Fatalf("placed on %s (score %d), want %s", p.HostID, p.Score, tt.want)
			}
		})
	}
}

func TestSpreadAndBinPackOverMany(t *testing.T) {
	for _, tt := range []struct {
		strategy  scheduler.Strategy
		wantHosts int
	}{{scheduler.BinPack, 1}, {scheduler.Spread, 4}} {
		t.Run(string(tt.strategy), func(t *testing.T) {
			h := schedulertest.New(t, schedulertest.Fleet(4, 4000, 8192)...)
			h.Config = scheduler.Config{Strategy: tt.strategy, FitWeight: 1000}
			used := map[string]bool{}
			for _, k := range []string{"s1", "s2", "s3", "s4"} {
				used[h.MustPlace(req(k, nil)).HostID] = true
			}
			if len(used) != tt.wantHosts {
				t.Fatalf("used %d hosts, want %d", len(used), tt.wantHosts)
			}
		})
	}
}

func TestPlaceIdempotentPerSession(t *testing.T) {
	h := schedulertest.New(t, schedulertest.Fleet(3, 4000, 8192)...)
	h.Config = scheduler.Config{Strategy: scheduler.Spread, FitWeight: 1000}
	first := h.MustPlace(req("s", nil))
	again, err := h.Place(req("s", nil))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Existing || again.HostID != first.HostID {
		t.Fatalf("second place = %+v, want existing on %s", again, first.HostID)
	}
	if err := h.Commit(again); err != nil {
		t.Fatalf("recommitting the existing placement: %v", err)
	}
	if u := h.View.Usage("t1"); u.Sandboxes != 1 {
		t.Fatalf("usage %+v after placing one session twice", u)
	}
}

func TestConflictingConcurrentPlans(t *testing.T) {
	// Room for one 3-CPU sandbox only. Two plans from the same view both pick it.
	h := schedulertest.New(t, host("a", nil))
	p1, err1 := h.Place(req("s1", func(r *scheduler.Request) { r.Resources.CPUMillis = 3000 }))
	p2, err2 := h.Place(req("s2", func(r *scheduler.Request) { r.Resources.CPUMillis = 3000 }))
	if err1 != nil || err2 != nil || p1.HostID != "a" || p2.HostID != "a" {
		t.Fatalf("plans %+v %v, %+v %v", p1, err1, p2, err2)
	}
	if err := h.Commit(p1); err != nil {
		t.Fatal(err)
	}
	err := h.Commit(p2)
	if errdefs.KindOf(err) != errdefs.ConflictKind {
		t.Fatalf("second commit err = %v, want conflict", err)
	}
	if _, ok := h.View.Placement("s2"); ok {
		t.Fatal("rejected plan was committed")
	}
	// Replanning from the new view finds nothing fits.
	if _, err := h.Place(req("s2", func(r *scheduler.Request) { r.Resources.CPUMillis = 3000 })); !scheduler.IsNoFit(err) {
		t.Fatalf("replan err = %v, want no fit", err)
	}
}

func TestValidate(t *testing.T) {
	plan := scheduler.Plan{SessionID: "s", Tenant: "t1", HostID: "a", Runtime: "runsc", Resources: scheduler.Resources{CPUMillis: 1000}}
	tests := []struct {
		name string
		mut  func(*schedulertest.View)
		plan scheduler.Plan
		kind errdefs.Kind
	}{
		{"fits", nil, plan, errdefs.Unknown},
		{"host gone", func(v *schedulertest.View) { v.AddHost(host("b", nil)) }, scheduler.Plan{SessionID: "s", Tenant: "t1", HostID: "zz"}, errdefs.ConflictKind},
		{"host cordoned", func(v *schedulertest.View) { v.AddHost(host("a", func(h *scheduler.Host) { h.Eligible = false })) }, plan, errdefs.ConflictKind},
		{"host down", func(v *schedulertest.View) {
			v.AddHost(host("a", func(h *scheduler.Host) { h.Status = scheduler.StatusDown }))
		}, plan, errdefs.ConflictKind},
		{"host draining", func(v *schedulertest.View) { v.AddHost(host("a", func(h *scheduler.Host) { h.Draining = true })) }, plan, errdefs.ConflictKind},
		{"capacity gone", func(v *schedulertest.View) {
			v.AddHost(host("a", func(h *scheduler.Host) { h.Allocated.CPUMillis = 3500 }))
		}, plan, errdefs.ConflictKind},
		{"placed elsewhere", func(v *schedulertest.View) {
			v.AddHost(host("b", nil))
			v.Commit(scheduler.Plan{SessionID: "s", Tenant: "t1", HostID: "b"})
		}, plan, errdefs.ConflictKind},
		{"already placed here", func(v *schedulertest.View) { v.Commit(plan) }, plan, errdefs.Unknown},
		{"malformed", nil, scheduler.Plan{HostID: "a"}, errdefs.InvalidArgumentKind},
		{"negative", nil, scheduler.Plan{SessionID: "s", Tenant: "t", HostID: "a", Resources: scheduler.Resources{CPUMillis: -1}}, errdefs.InvalidArgumentKind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := schedulertest.NewView(host("a", nil))
			if tt.mut != nil {
				tt.mut(v)
			}
			err := scheduler.Validate(v, tt.plan)
			if tt.kind == errdefs.Unknown {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if errdefs.KindOf(err) != tt.kind {
				t.Fatalf("err = %v (kind %v), want %v", err, errdefs.KindOf(err), tt.kind)
			}
		})
	}
}

func TestQuota(t *testing.T) {
	tests := []struct {
		name  string
		quota scheduler.Quota
		n     int // placements of 1 CPU / 1 GiB that succeed before the failing one
		names string
	}{
		{"concurrent sandboxes", scheduler.Quota{ConcurrentSandboxes: 2}, 2, "concurrent_sandboxes"},
		{"cpu", scheduler.Quota{CPUMillis: 3500}, 3, "cpu_millis"},
		{"memory", scheduler.Quota{MemoryMiB: 1024}, 1, "memory_mib"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := schedulertest.New(t, schedulertest.Fleet(4, 4000, 8192)...)
			h.Quota = tt.quota
			for i := range tt.n {
				h.MustPlace(req(string(rune('a'+i)), nil))
			}
			p, err := h.Place(req("over", nil))
			if err != nil {
				t.Fatal(err)
			}
			err = h.Commit(p)
			if errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), tt.names) || !strings.Contains(err.Error(), "t1") {
				t.Fatalf("err = %v, want resource exhausted naming %s", err, tt.names)
			}
			// Another tenant is not affected.
			p, _ = h.Place(req("other", func(r *scheduler.Request) { r.Tenant = "t2" }))
			if err := h.Commit(p); err != nil {
				t.Fatalf("other tenant: %v", err)
			}
		})
	}
}

func TestQuotaFromPolicy(t *testing.T) {
	pol, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	q := scheduler.QuotaFromPolicy(pol.DefaultQuota)
	if q.ConcurrentSandboxes != pol.DefaultQuota.ConcurrentSandboxes || q.CPUMillis != int64(pol.DefaultQuota.CPUMillis) || q.MemoryMiB != int64(pol.DefaultQuota.MemoryMiB) {
		t.Fatalf("quota %+v from %+v", q, pol.DefaultQuota)
	}
}

func TestInvalidRequest(t *testing.T) {
	h := schedulertest.New(t, host("a", nil))
	for _, r := range []scheduler.Request{
		{Tenant: "t"},
		{SessionID: "s"},
		req("s", func(r *scheduler.Request) { r.Resources.MemoryMiB = -1 }),
		req("s", func(r *scheduler.Request) { r.Constraints = []scheduler.Constraint{{Key: "k", Op: "~"}} }),
	} {
		if _, err := h.Place(r); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
			t.Errorf("place %+v: err = %v, want invalid argument", r, err)
		}
	}
}

func BenchmarkPlace1000Hosts(b *testing.B) {
	h := schedulertest.New(b, schedulertest.Fleet(1000, 64000, 65536)...)
	r := req("s", func(r *scheduler.Request) { r.Image = "py" })
	for b.Loop() {
		if _, err := scheduler.Place(h.View, r, h.Config); err != nil {
			b.Fatal(err)
		}
	}
}
