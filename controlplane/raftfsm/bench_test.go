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
// leader (raft pipelines and batches their Applies), and reports
// placements/s. Each placement is planned by the scheduler over all 1,000
// hosts and admitted by every replica's FSM.
func BenchmarkPlacementsPerSecond(b *testing.B) {
	for _, strategy := range []scheduler.Strategy{scheduler.Spread, scheduler.BinPack} {
		b.Run(string(strategy), func(b *testing.B) { benchPlacements(b, strategy) })
	}
}

func benchPlacements(b *testing.B, strategy scheduler.Strategy) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	nodes := make([]*Node, 3)
	for i := range nodes {
		cfg := testConfig(fmt.Sprintf("n%d", i+1), b.TempDir())
		cfg.Scheduler = scheduler.DefaultConfig
		cfg.Scheduler.Strategy = strategy
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
				req := scheduler.Request{SessionID: fmt.Sprintf("bench-%d", i), Tenant: fmt.Sprintf("t%d", i%50),
					Runtime: "runsc", Resources: scheduler.Resources{CPUMillis: 250, MemoryMiB: 256}}
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
	b.ReportMetric(0, "ns/op")
}
