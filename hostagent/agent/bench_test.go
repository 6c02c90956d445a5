package agent_test

// Benchmarks of the host agent with the containerd gVisor driver, against
// the driver called directly and a raw containerd task exec, in one run on
// the same sandbox, so the ratios are what the agent (gRPC, mutual TLS,
// bookkeeping) adds:
//
//	go test -run '^$' -bench . ./hostagent/agent/

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

const (
	benchImage  = "localhost/corral/busybox:1"
	coldSamples = 15
	execSamples = 50
)

// benchHost is a controller and an agent over the containerd gVisor driver.
type benchHost struct {
	ctl *hostctl.Controller
	d   *containerd.Driver
	sc  pb.SandboxServiceClient
}

func newBenchHost(b *testing.B) *benchHost {
	b.Helper()
	ctx := context.Background()
	d := containerdtest.NewDriver(b, containerd.Config{})
	ctl, err := hostctl.New(hostctl.Config{Dir: b.TempDir(), HeartbeatInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := ctl.Serve(l)
	b.Cleanup(srv.Stop)
	tok, err := ctl.IssueToken(time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	a, err := agent.New(ctx, agent.Config{
		HostID: "bench", ControlPlane: l.Addr().String(), JoinToken: secret(tok.Reveal()), StateDir: b.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: containerd.RuntimeGVisor,
	})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { a.Run(runCtx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := ctl.Wait(wctx, func(hs map[string]hostctl.Host) bool { return hs["bench"].Connected }); err != nil {
		b.Fatal(err)
	}
	sc, closeFn, err := ctl.DialSandbox("bench", "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { closeFn() })
	return &benchHost{ctl: ctl, d: d, sc: sc}
}

// agentExec runs argv through the agent's SandboxService to its result.
func (h *benchHost) agentExec(ctx context.Context, key string, argv ...string) error {
	st, err := h.sc.Exec(ctx, &pb.ExecRequest{Key: key, Command: argv})
	if err != nil {
		return err
	}
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return fmt.Errorf("no result")
		}
		if err != nil {
			return err
		}
		if r := m.GetResult(); r != nil {
			if r.ExitCode != 0 {
				return fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
			}
			return nil
		}
	}
}

func quantiles(b *testing.B, prefix string, ds []time.Duration) time.Duration {
	slices.Sort(ds)
	p50, p99 := ds[len(ds)/2], ds[len(ds)*99/100]
	b.ReportMetric(float64(p50.Microseconds())/1000, prefix+"-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, prefix+"-p99-ms")
	return p50
}

// BenchmarkAgentColdStart: ensure a gVisor sandbox through the agent and run
// its first command over SandboxService, against the driver's create,
// attach and exec, alternately.
func BenchmarkAgentColdStart(b *testing.B) {
	h := newBenchHost(b)
	ctx := context.Background()
	var viaAgent, viaDriver []time.Duration
	for i := range max(b.N, coldSamples) {
		start := time.Now()
		ref, err := h.d.Create(ctx, driver.Spec{Key: fmt.Sprintf("bench-driver-%d", i), Image: benchImage})
		if err != nil {
			b.Fatal(err)
		}
		sb, err := h.d.Attach(ctx, ref)
		if err == nil {
			_, err = sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}})
		}
		viaDriver = append(viaDriver, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		if err := h.d.Destroy(ctx, ref); err != nil {
			b.Fatal(err)
		}

		key := fmt.Sprintf("bench-agent-%d", i)
		start = time.Now()
		if _, err := h.ctl.Ensure(ctx, "bench", &pb.EnsureSandbox{Key: key, Image: benchImage}); err != nil {
			b.Fatal(err)
		}
		if err := h.agentExec(ctx, key, "true"); err != nil {
			b.Fatal(err)
		}
		viaAgent = append(viaAgent, time.Since(start))
		if err := h.ctl.Destroy(ctx, "bench", key); err != nil {
			b.Fatal(err)
		}
	}
	d := quantiles(b, "driver", viaDriver)
	a := quantiles(b, "agent", viaAgent)
	b.ReportMetric(float64(a)/float64(d), "agent/driver-p50")
}

// BenchmarkAgentExecVsRaw: one command in a running gVisor sandbox as a raw
// containerd task exec, through the driver, and through the agent's
// SandboxService, in turn.
func BenchmarkAgentExecVsRaw(b *testing.B) {
	h := newBenchHost(b)
	ctx := context.Background()
	st, err := h.ctl.Ensure(ctx, "bench", &pb.EnsureSandbox{Key: "bench-exec", Image: benchImage})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.ctl.Destroy(context.Background(), "bench", st.Key) })
	refs, err := h.d.List(ctx)
	if err != nil || len(refs) != 1 {
		b.Fatalf("driver sandboxes: %v %v", refs, err)
	}
	sb, err := h.d.Attach(ctx, refs[0])
	if err != nil {
		b.Fatal(err)
	}
	c, err := h.d.Client().LoadContainer(ctx, refs[0].ID)
	if err != nil {
		b.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	spec, err := task.Spec(ctx)
	if err != nil {
		b.Fatal(err)
	}
	rawExec := func(i int) error {
		ps := *spec.Process
		ps.Args = []string{"true"}
		p, err := task.Exec(ctx, fmt.Sprintf("bench-raw-%d", i), &ps, cio.NullIO)
		if err != nil {
			return err
		}
		defer p.Delete(ctx)
		exited, err := p.Wait(ctx)
		if err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		if s := <-exited; s.ExitCode() != 0 {
			return fmt.Errorf("raw exec exited %d", s.ExitCode())
		}
		return nil
	}
	var raw, viaDriver, viaAgent []time.Duration
	for i := range max(b.N, execSamples) {
		start := time.Now()
		if err := rawExec(i); err != nil {
			b.Fatal(err)
		}
		raw = append(raw, time.Since(start))
		start = time.Now()
		if _, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		viaDriver = append(viaDriver, time.Since(start))
		start = time.Now()
		if err := h.agentExec(ctx, "bench-exec", "true"); err != nil {
			b.Fatal(err)
		}
		viaAgent = append(viaAgent, time.Since(start))
	}
	r := quantiles(b, "raw", raw)
	quantiles(b, "driver", viaDriver)
	a := quantiles(b, "agent", viaAgent)
	b.ReportMetric(float64(a)/float64(r), "agent/raw-p50")
}

func secret(s string) logging.Secret { return logging.Secret(s) }
