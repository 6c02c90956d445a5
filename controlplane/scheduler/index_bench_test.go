package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
)

// providers are the three a bench fleet's hosts offer, with the runtime
// each runs on.
var providers = []struct{ name, runtime string }{{"gvisor", "runsc"}, {"runc", "runc"}, {"process", "process"}}

// poolFleet is n hosts in pools of 100 (p0, p1, ...), each pool's hosts
// offering the three providers in turn, in 10 zones.
func poolFleet(n int) []scheduler.Host {
	hosts := schedulertest.Fleet(n, 64000, 65536)
	for i := range hosts {
		pv := providers[i%3]
		hosts[i].Runtimes, hosts[i].Providers = []string{pv.runtime}, []string{pv.name}
		hosts[i].Labels = map[string]string{scheduler.PoolLabel: fmt.Sprintf("p%d", i/100), scheduler.ZoneLabel: fmt.Sprintf("z%d", i%10)}
	}
	return hosts
}

// poolRequests are requests for one pool each and one provider, over
// every pool of a fleet of n hosts: about 33 candidates each.
func poolRequests(n int) []scheduler.Request {
	var out []scheduler.Request
	for i := range 64 {
		pv := providers[i%3]
		out = append(out, scheduler.Request{SessionID: fmt.Sprintf("s%d", i), Tenant: fmt.Sprintf("t%d", i%8),
			Runtime: pv.runtime, Provider: pv.name, Image: "py",
			Resources: scheduler.Resources{CPUMillis: 250, MemoryMiB: 256},
			Pools:     []string{fmt.Sprintf("p%d", (i*7)%(n/100))}})
	}
	return out
}

// BenchmarkPlaceCostByFleetSize is the scheduler's cost per placement over
// fleets of 100, 1,000 and 10,000 hosts in pools of 100 hosts with 3
// providers, each request for one pool and provider: over the index
// (what the FSM's view keeps) it stays flat, the candidates being as
// many at every size; the full scan, measured beside it, grows with the
// fleet. Each of b.N rounds places once per size and way.
func BenchmarkPlaceCostByFleetSize(b *testing.B) {
	sizes := []int{100, 1000, 10000}
	views := map[int]*schedulertest.View{}
	for _, n := range sizes {
		views[n] = schedulertest.NewView(poolFleet(n)...)
	}
	cfg := scheduler.DefaultConfig
	b.ResetTimer()
	cost := func(v scheduler.View, n int) float64 {
		reqs := poolRequests(n)
		start := time.Now()
		for i := range b.N {
			if _, err := scheduler.Place(v, reqs[i%len(reqs)], cfg); err != nil {
				b.Fatal(err)
			}
		}
		return float64(time.Since(start).Nanoseconds()) / float64(b.N)
	}
	indexed, full := map[int]float64{}, map[int]float64{}
	for _, n := range sizes {
		indexed[n] = cost(views[n], n)
		full[n] = cost(views[n].FullScan(), n)
	}
	for _, n := range sizes {
		b.ReportMetric(indexed[n], fmt.Sprintf("ns/place@%d", n))
		b.ReportMetric(full[n], fmt.Sprintf("fullscan-ns/place@%d", n))
	}
	b.ReportMetric(indexed[10000]/indexed[100], "x10000/100")
	b.ReportMetric(full[10000]/full[100], "fullscan-x10000/100")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPlaceMoveCostByFleetSize is BenchmarkPlaceCostByFleetSize for
// the plan of a move (a drain's or a lost host's): each placed session is
// planned elsewhere, its own host refused, over the index and, beside it,
// over the full scan.
func BenchmarkPlaceMoveCostByFleetSize(b *testing.B) {
	sizes := []int{100, 1000, 10000}
	views := map[int]*schedulertest.View{}
	cfg := scheduler.DefaultConfig
	for _, n := range sizes {
		v := schedulertest.NewView(poolFleet(n)...)
		for _, r := range poolRequests(n) {
			p, err := scheduler.Place(v, r, cfg)
			if err != nil {
				b.Fatal(err)
			}
			v.Commit(p)
		}
		views[n] = v
	}
	b.ResetTimer()
	cost := func(v scheduler.View, n int) float64 {
		reqs := poolRequests(n)
		from := make([]string, len(reqs))
		for i, r := range reqs {
			p, _ := v.Placement(r.SessionID)
			from[i] = p.HostID
		}
		start := time.Now()
		for i := range b.N {
			k := i % len(reqs)
			if _, err := scheduler.PlaceMove(v, reqs[k], cfg, func(h *scheduler.Host) bool { return h.ID != from[k] }); err != nil {
				b.Fatal(err)
			}
		}
		return float64(time.Since(start).Nanoseconds()) / float64(b.N)
	}
	indexed, full := map[int]float64{}, map[int]float64{}
	for _, n := range sizes {
		indexed[n] = cost(views[n], n)
		full[n] = cost(views[n].FullScan(), n)
	}
	for _, n := range sizes {
		b.ReportMetric(indexed[n], fmt.Sprintf("ns/move@%d", n))
		b.ReportMetric(full[n], fmt.Sprintf("fullscan-ns/move@%d", n))
	}
	b.ReportMetric(indexed[10000]/indexed[100], "x10000/100")
	b.ReportMetric(full[10000]/full[100], "fullscan-x10000/100")
	b.ReportMetric(0, "ns/op")
}
