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
// and their ratio.
func BenchmarkBashToolOverhead(b *testing.B) {
	sb := gvisorHost(b).Sandbox()
	r := tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	ctx := context.Background()
	var viaTool, raw []time.Duration
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
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	t, e := median(viaTool), median(raw)
	b.ReportMetric(float64(t.Microseconds())/1000, "bash-tool-p50-ms")
	b.ReportMetric(float64(e.Microseconds())/1000, "raw-exec-p50-ms")
	b.ReportMetric(float64(t)/float64(e), "tool/exec-ratio")
}
