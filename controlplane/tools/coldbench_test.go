package tools_test

// Time from session create to the first tool result, with the sandbox
// cold, against the raw baseline of the same run:
//
//	go test -run '^$' -bench SessionFirstToolResult ./controlplane/tools/
//
// The session side is corral dev's parts in one process, minus the API and
// the database: the agent loop with the fake model (an in-memory event log),
// the tools runner, and a real host agent with the containerd gVisor driver
// behind its SandboxService; the sandbox is ensured on the session's first
// tool call, as the server's sandboxFor does. The baseline is the driver
// alone: create, attach and exec `true` in a new sandbox.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

const coldSamples = 12

func BenchmarkSessionFirstToolResultCold(b *testing.B) {
	d := gvisorDriver(b)
	h := startHost(b, d, containerd.RuntimeGVisor, debianImage)
	ctx := context.Background()
	var agent agentloop.Agent
	agent.Model.ID = "fake"
	agent.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	var session, raw []time.Duration
	for i := range max(b.N, coldSamples) {
		// The raw baseline: a new sandbox straight through the driver.
		start := time.Now()
		ref, err := d.Create(ctx, driver.Spec{Key: fmt.Sprintf("bench-raw-%d", i), Image: debianImage})
		if err != nil {
			b.Fatal(err)
		}
		sb, err := d.Attach(ctx, ref)
		if err == nil {
			_, err = sb.Exec(ctx, driver.ExecRequest{Command: []string{"true"}})
		}
		raw = append(raw, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Destroy(ctx, ref); err != nil {
			b.Fatal(err)
		}

		// A session: created, a message whose first step is a bash call,
		// the loop stepped until the tool result is in the log.
		id := fmt.Sprintf("sesn_bench_%d", i)
		start = time.Now()
		st := looptest.NewMemStore()
		st.CreateSession(id, agent)
		r := &agentloop.Runner{Store: st, Model: model.Fake{}, NewID: looptest.NewID,
			Tools: tools.NewRunner(func(ctx context.Context, key string) (tools.Sandbox, error) {
				if _, err := h.ctl.Ensure(ctx, "h1", &pb.EnsureSandbox{Key: key, Image: debianImage, Runtime: containerd.RuntimeGVisor}); err != nil {
					return nil, err
				}
				return tools.Remote{Client: h.sc, Key: key}, nil
			})}
		msg, _ := json.Marshal(map[string]any{"id": looptest.NewID(), "type": "user.message",
			"content": []map[string]string{{"type": "text", "text": `!tool bash {"command":"true"}`}}})
		if err := st.AddUserEvent(id, msg); err != nil {
			b.Fatal(err)
		}
		for !slices.ContainsFunc(st.Events(id), func(e agentloop.Event) bool { return e.Type == agentloop.AgentToolResult }) {
			if _, err := r.Step(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		session = append(session, time.Since(start))
		if e := st.Events(id); e[len(e)-1].IsError {
			b.Fatalf("the tool result is an error: %+v", e[len(e)-1])
		}
		if err := h.ctl.Destroy(ctx, "h1", id); err != nil {
			b.Fatal(err)
		}
	}
	q := func(ds []time.Duration, p int) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)*p/100]
	}
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"session", session}, {"raw", raw}} {
		b.ReportMetric(float64(q(m.ds, 50).Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(q(m.ds, 99).Microseconds())/1000, m.name+"-p99-ms")
	}
	b.ReportMetric(float64(q(session, 50))/float64(q(raw, 50)), "session/raw-p50")
	b.ReportMetric(float64(q(session, 99))/float64(q(raw, 99)), "session/raw-p99")
}
