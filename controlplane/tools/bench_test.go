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
)

const overheadSamples = 40

// BenchmarkBashToolOverhead alternates one bash tool call of `true` (the
// wrapper shell, the directory marker, a bash started inside) with a raw
// Exec of `true` through the same SandboxService, and reports both medians
// and their ratio (the target: at most 1.2). A third sample, a raw Exec of
// `bash -c true`, splits the overhead: what the fresh bash every call
// starts costs by itself (bash/exec-ratio), and what corral adds around it
// (tool/bash-ratio: the script, the execution's markers on the host).
func BenchmarkBashToolOverhead(b *testing.B) {
	sb := gvisorHost(b).Sandbox()
	r := tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	ctx := context.Background()
	var viaTool, raw, rawBash []time.Duration
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
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	t, e, sh := median(viaTool), median(raw), median(rawBash)
	b.ReportMetric(float64(t.Microseconds())/1000, "bash-tool-p50-ms")
	b.ReportMetric(float64(e.Microseconds())/1000, "raw-exec-p50-ms")
	b.ReportMetric(float64(sh.Microseconds())/1000, "raw-bash-p50-ms")
	b.ReportMetric(float64(t)/float64(e), "tool/exec-ratio")
	b.ReportMetric(float64(sh)/float64(e), "bash/exec-ratio")
	b.ReportMetric(float64(t)/float64(sh), "tool/bash-ratio")
}
