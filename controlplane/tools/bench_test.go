package tools_test

// The bash tool's overhead over a raw exec, in one gVisor sandbox:
//
//	go test -run '^$' -bench BashToolOverhead ./controlplane/tools/

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

const overheadSamples = 40

// BenchmarkBashToolOverhead alternates one bash tool call of `true` (the
// wrapper shell, the directory marker, a bash started inside) with a raw
// exec of `true` by the sandbox itself (a runsc exec through containerd),
// and reports both medians and their ratio (the target: at most 1.2).
// Two more samples split the overhead: an Exec of `true` through the same
// SandboxService (the fleet, the host, the sandbox's command server:
// tool/exec-ratio), and one of `bash -c true`, what the fresh bash every
// call starts costs by itself (bash/exec-ratio) and what corral adds
// around it (tool/bash-ratio: the script, the execution's markers on the
// host).
func BenchmarkBashToolOverhead(b *testing.B) {
	d := gvisorDriver(b)
	sb := startHost(b, d, containerd.RuntimeGVisor, debianImage).Sandbox()
	r := tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	ctx := context.Background()
	refs, err := d.List(ctx)
	if err != nil || len(refs) != 1 {
		b.Fatalf("the session's sandbox: %v %v", refs, err)
	}
	// The first command runs as an exec of its own; the sandbox's command
	// server starts after it.
	for range 2 {
		if _, err := sb.Exec(ctx, tools.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
	}
	var viaTool, raw, rawBash, runsc []time.Duration
	for i := range max(b.N, overheadSamples) {
		// Each call its own tool use, as the loop makes them: the host
		// keeps it by its execution id.
		call := agentloop.ToolCall{EventID: fmt.Sprintf("sevt_bench_%d", i), Name: "bash", Input: []byte(`{"command":"true"}`)}
		start := time.Now()
		res, err := r.Run(ctx, "bench", call)
		viaTool = append(viaTool, time.Since(start))
		if err != nil || res.IsError {
			b.Fatalf("bash true: %+v %v", res, err)
		}
		start = time.Now()
		er, err := sb.Exec(ctx, tools.ExecRequest{Command: []string{"true"}})
		raw = append(raw, time.Since(start))
		if err != nil || er.ExitCode != 0 {
			b.Fatalf("exec true: %+v %v", er, err)
		}
		start = time.Now()
		er, err = sb.Exec(ctx, tools.ExecRequest{Command: []string{"bash", "-c", "true"}})
		rawBash = append(rawBash, time.Since(start))
		if err != nil || er.ExitCode != 0 {
			b.Fatalf("exec bash -c true: %+v %v", er, err)
		}
		start = time.Now()
		if err := containerdtest.RawExec(ctx, d, refs[0].ID, "true"); err != nil {
			b.Fatalf("runsc exec true: %v", err)
		}
		runsc = append(runsc, time.Since(start))
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	t, e, sh, rs := median(viaTool), median(raw), median(rawBash), median(runsc)
	b.ReportMetric(float64(t.Microseconds())/1000, "bash-tool-p50-ms")
	b.ReportMetric(float64(rs.Microseconds())/1000, "runsc-exec-p50-ms")
	b.ReportMetric(float64(e.Microseconds())/1000, "exec-p50-ms")
	b.ReportMetric(float64(sh.Microseconds())/1000, "bash-p50-ms")
	b.ReportMetric(float64(t)/float64(rs), "tool/runsc-exec-ratio")
	b.ReportMetric(float64(t)/float64(e), "tool/exec-ratio")
	b.ReportMetric(float64(sh)/float64(e), "bash/exec-ratio")
	b.ReportMetric(float64(t)/float64(sh), "tool/bash-ratio")
}
