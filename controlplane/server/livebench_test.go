package server_test

// A drain of a host with N idle gVisor sandboxes to another pausable host
// agent on this machine, every sandbox moved live. As root with the
// runtime installed (CORRAL_DRAIN_LIVE_N sets N, default 50):
//
//	CORRAL_DRAIN_LIVE_N=10 go test -run '^$' -bench DrainLive -benchtime 1x ./controlplane/server/

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// BenchmarkDrainLive: N idle tool-using sessions (each ran one bash call)
// on host A, then host B joins and A is drained (through the fleet, as the
// admin API's DrainHost does). Reported: the drain's total time, each
// sandbox's move (fence to fence lifted) p50 and p99, and how many moved
// live; it fails unless every sandbox moved live and a sample of the
// sessions answers on B. b.N is ignored: one drain per run.
func BenchmarkDrainLive(b *testing.B) {
	containerdtest.Address(b) // skips (fails under CI) without the runtime
	n := 50
	if s := os.Getenv("CORRAL_DRAIN_LIVE_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("CORRAL_DRAIN_LIVE_N=%q: want a positive count", s)
		}
		n = v
	}
	srv := servertest.Start(b, pgtest.New(b), server.Config{NodeID: "bench", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: -1})
	cfg := containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}
	startGVisorHostAs(b, srv, "drain-a", cfg, agent.Resources{})
	// Tenants of at most 10 sessions each (the default quota is 20).
	var tcs []*tenantClient
	for i := range (n + 9) / 10 {
		tcs = append(tcs, newTenantClient(b, srv, tenant.ID(fmt.Sprintf("tenant_drain%d", i))))
	}
	type sess struct {
		tc *tenantClient
		id string
	}
	all := make([]sess, n)
	for i := range all {
		all[i] = sess{tcs[i%len(tcs)], tcs[i%len(tcs)].newSession(b)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// Filled four at a time: a 2-core machine makes gVisor sandboxes
	// about as fast with more.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		fail error
	)
	sem := make(chan struct{}, 4)
	for _, s := range all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			tctx, tcancel := context.WithTimeout(ctx, 3*time.Minute)
			defer tcancel()
			out, err := s.tc.toolTurn(tctx, s.id, echoOK)
			if err == nil && strings.TrimSpace(out) != "ok" {
				err = fmt.Errorf("tool result %q", out)
			}
			if err != nil {
				mu.Lock()
				fail = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if fail != nil {
		b.Fatalf("filling host A: %v", fail)
	}
	startGVisorHostAs(b, srv, "drain-b", cfg, agent.Resources{})
	b.Cleanup(func() { // before the hosts': they destroy the sandboxes
		for _, s := range all {
			s.tc.deleteSession(b, s.id)
		}
	})

	var took []time.Duration
	states := map[fleet.DrainState]int{}
	b.ResetTimer()
	start := time.Now()
	err := srv.Fleet().Drain(ctx, "drain-a", 20*time.Minute, func(p fleet.DrainProgress) {
		states[p.State]++
		if p.State == fleet.DrainMovedLive {
			took = append(took, p.Took)
		} else {
			b.Logf("%s: %s (%v): %v", p.SessionID, p.State, p.Took, p.Err)
		}
	})
	total := time.Since(start)
	b.StopTimer()
	if err != nil {
		b.Fatalf("drain: %v", err)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(total.Seconds(), "drain-s")
	b.ReportMetric(float64(len(took)), "moved-live")
	if len(took) > 0 {
		b.ReportMetric(ms(quantile(took, 50)), "per-sandbox-p50-ms")
		b.ReportMetric(ms(quantile(took, 99)), "per-sandbox-p99-ms")
	}
	b.Logf("%d sandboxes drained in %v: %v", n, total, states)
	if len(took) != n {
		b.Fatalf("%d of %d sandboxes moved live: %v", len(took), n, states)
	}
	// They answer on B.
	for i := 0; i < n; i += max(1, n/5) {
		tctx, tcancel := context.WithTimeout(ctx, 2*time.Minute)
		out, err := all[i].tc.toolTurn(tctx, all[i].id, echoOK)
		tcancel()
		if err != nil || !strings.HasSuffix(strings.TrimSpace(out), "ok") || !strings.HasPrefix(out, fleet.MovedNotice[scheduler.MovedLive]) {
			b.Fatalf("session %d after the drain: %q %v", i, out, err)
		}
	}
}
