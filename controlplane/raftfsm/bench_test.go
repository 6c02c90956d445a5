package raftfsm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/waitfor"
)

// BenchmarkPlacementsPerSecond commits placements on a 3-node loopback
// cluster holding 1,000 simulated hosts, from many concurrent callers on the
// leader (which batches them into place_batch entries), and reports
// placements/s and placements per log entry. Each placement is planned by
// the scheduler over the fleet view's index and admitted by every
// replica's FSM.
//
// one_pool is the fleet as before pools: every host alike, every request
// a candidate of each. 10_pools_3_providers is 1,000 hosts in 10 pools of
// 100, each pool's hosts offering gvisor, runc or process in turn; each
// tenant may use 2 of the pools and asks for one provider, so about 67
// hosts are candidates. _unbatched is the same with one entry per
// placement (Config.PlaceBatch 1), as before batching, in the same run.
func BenchmarkPlacementsPerSecond(b *testing.B) {
	for _, fleet := range []string{"one_pool", "10_pools_3_providers"} {
		for _, strategy := range []scheduler.Strategy{scheduler.Spread, scheduler.BinPack} {
			b.Run(fleet+"/"+string(strategy), func(b *testing.B) { benchPlacements(b, fleet, strategy, 0) })
			b.Run(fleet+"/"+string(strategy)+"_unbatched", func(b *testing.B) { benchPlacements(b, fleet, strategy, 1) })
		}
	}
}

// benchProviders are the providers of the 10-pool fleet and the runtime
// each runs on.
var benchProviders = []struct{ name, runtime string }{{"gvisor", "runsc"}, {"runc", "runc"}, {"process", "process"}}

func benchPlacements(b *testing.B, fleet string, strategy scheduler.Strategy, batch int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	nodes := make([]*Node, 3)
	for i := range nodes {
		cfg := testConfig(fmt.Sprintf("n%d", i+1), b.TempDir())
		cfg.Scheduler = scheduler.DefaultConfig
		cfg.Scheduler.Strategy = strategy
		cfg.PlaceBatch = batch
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			joinVia(b, nodes[0], &cfg)
		}
		n, err := Start(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer n.Shutdown()
		nodes[i] = n
		if i == 0 {
			waitfor.Cond(b, 30*time.Second, "n1 to lead", func() bool { return n.IsLeader() && n.leaderHTTP() != "" })
		}
	}
	leader := nodes[0]
	waitfor.Cond(b, 30*time.Second, "followers to know the leader", func() bool {
		return nodes[1].leaderHTTP() != "" && nodes[2].leaderHTTP() != ""
	})

	// 1,000 hosts, each with room for 256 sandboxes of 250m / 256 MiB.
	hosts := schedulertest.Fleet(1000, 64000, 64<<10)
	pools := fleet != "one_pool"
	if pools {
		for i := range hosts {
			pv := benchProviders[i%3]
			hosts[i].Runtimes, hosts[i].Providers = []string{pv.runtime}, []string{pv.name}
			hosts[i].Labels = map[string]string{scheduler.PoolLabel: fmt.Sprintf("p%d", i/100), scheduler.ZoneLabel: fmt.Sprintf("z%d", i%10)}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, h := range hosts {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := Apply(ctx, leader, RegisterHost, "host/"+h.ID, h); err != nil {
				b.Errorf("registering %s: %v", h.ID, err)
			}
		})
	}
	wg.Wait()
	var entries, placed int64
	if leader.batch != nil {
		entries, placed = leader.batch.entries.Load(), leader.batch.placements.Load()
	}

	const workers = 256
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				tenant := i % 50
				req := scheduler.Request{SessionID: fmt.Sprintf("bench-%d", i), Tenant: fmt.Sprintf("t%d", tenant),
					Runtime: "runsc", Resources: scheduler.Resources{CPUMillis: 250, MemoryMiB: 256}}
				if pools {
					// Tenant t may use pools t and t+1 (of 10), and asks
					// for provider t mod 3.
					pv := benchProviders[tenant%3]
					req.Runtime, req.Provider = pv.runtime, pv.name
					req.Pools = []string{fmt.Sprintf("p%d", tenant%10), fmt.Sprintf("p%d", (tenant+1)%10)}
				}
				if _, err := place(ctx, leader, req); err != nil {
					b.Errorf("placing %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "placements/s")
	if leader.batch == nil {
		b.ReportMetric(1, "placements/entry")
	} else if e := leader.batch.entries.Load() - entries; e > 0 {
		b.ReportMetric(float64(leader.batch.placements.Load()-placed)/float64(e), "placements/entry")
	}
	b.ReportMetric(0, "ns/op")
}
