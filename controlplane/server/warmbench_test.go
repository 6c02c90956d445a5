package server_test

// New session → first tool result when the host's warm pool holds a
// sandbox of the session's class, through the same parts as
// BenchmarkSessionFirstToolResultCold. In the same run, alternated with
// it, the baseline: the warm tool turn of a session whose sandbox is
// running (as BenchmarkWarmToolTurn measures it). As root with the runtime
// installed:
//
//	go test -run '^$' -bench WarmPoolFirstToolResult ./controlplane/server/

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/waitfor"
)

// BenchmarkWarmPoolFirstToolResult: POST /v1/sessions, open its stream,
// POST a user.message whose (fake) model calls bash `true`, until the
// agent.tool_result arrives, with the host's pool (min 1, max 1) holding a
// sandbox of the session's class: the default image with the gvisor
// profile's limits. Before each sample the benchmark waits for the pool's
// count signal (the refill after the last claim) and for the control
// plane to count the pooled sandbox (so each new session claims it at its
// create: fleet.PrepareWarm), and it fails if a session's sandbox is not
// the pooled one. Target: p50 within 1.3x of the warm turn's.
func BenchmarkWarmPoolFirstToolResult(b *testing.B) {
	srv := servertest.Start(b, pgtest.New(b), server.Config{NodeID: "bench", SandboxRuntime: admission.RuntimeGVisor})
	d, a := gvisorBenchHostWith(b, srv, []agent.PoolClass{gvisorPoolClass(b)})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(b, srv, tenant.Default))
	ag := post(b, c, base+"/v1/agents", map[string]any{"name": "bench", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	env := post(b, c, base+"/v1/environments", map[string]any{"name": "bench"})

	// pooled waits until the pool has a ready sandbox, and the control
	// plane counts it, and returns the ids.
	pooled := func() []string {
		ids := awaitPooled(b, a)
		awaitWarm(b, srv, "bench", server.DefaultSandboxImage, 1)
		return ids
	}
	del := func(id string) { deleteSession(b, c, base, id) }
	// session opens a session's stream and returns a function that runs one
	// turn (bash `true`) and returns the time to its tool result, and one
	// that closes the stream.
	session := func(id string) (turn func(start time.Time) time.Duration, closeFn func()) {
		stream, err := c.Get(base + "/v1/sessions/" + id + "/events/stream?beta=true")
		if err != nil {
			b.Fatal(err)
		}
		frames := sseFrames(stream.Body)
		next := func(what string) sseFrame {
			f := waitfor.Chan(b, 2*time.Minute, what, frames)
			if f.event == "session.error" || f.event == "agent.tool_result" && f.data["is_error"] == true {
				b.Fatalf("%s %v", f.event, f.data)
			}
			return f
		}
		return func(start time.Time) time.Duration {
			post(b, c, base+"/v1/sessions/"+id+"/events?beta=true", map[string]any{"events": []any{
				map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tool bash {"command":"true"}`}}},
			}})
			for next("the tool result").event != "agent.tool_result" {
			}
			took := time.Since(start)
			// A running session cannot be deleted (400): the turn ends first.
			for next("the session to go idle").event != "session.status_idle" {
			}
			return took
		}, func() { stream.Body.Close() }
	}
	newSession := func() string {
		return post(b, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})["id"].(string)
	}

	// The existing session of the baseline: its first turn places it.
	existing := newSession()
	b.Cleanup(func() { del(existing) })
	warmTurn, closeExisting := session(existing)
	defer closeExisting()
	pooled()
	warmTurn(time.Now())

	var first, warm []time.Duration
	for range max(b.N, coldSamples) {
		// Both samples start with the pool full and no refill running.
		ids := pooled()
		warm = append(warm, warmTurn(time.Now()))
		start := time.Now()
		id := newSession()
		turn, closeFn := session(id)
		first = append(first, turn(start))
		closeFn()
		if sb := sandboxOf(b, d, id); !slices.Contains(ids, sb) {
			b.Fatalf("session %s ran in sandbox %q, not the pooled one %v", id, sb, ids)
		}
		del(id)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, q := range []int{50, 99} {
		b.ReportMetric(ms(quantile(first, q)), fmt.Sprintf("first-p%d-ms", q))
		b.ReportMetric(ms(quantile(warm, q)), fmt.Sprintf("warm-turn-p%d-ms", q))
		b.ReportMetric(float64(quantile(first, q))/float64(quantile(warm, q)), fmt.Sprintf("first/warm-turn-p%d", q))
	}
}
