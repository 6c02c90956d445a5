package server_test

// Time from session create to the first tool result, with the sandbox
// cold, through corral dev's parts in one process: the node (PostgreSQL,
// Raft, the REST API and its event stream, the agent loop with the fake
// model) and a host agent with the containerd gVisor driver. In the same
// run, the raw baseline: a new sandbox created, attached and `true` run
// in it straight through the driver. As root with the runtime installed:
//
//	go test -run '^$' -bench SessionFirstToolResult ./controlplane/server/

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/policy"
)

const coldSamples = 12

// gvisorBenchHostWith joins a host agent with the gVisor driver to srv, or
// skips saying why the machine cannot run one (failing under CI). At
// cleanup it waits until the host has destroyed the sandboxes of the
// sessions the benchmark deleted (a placement's release reaches the host
// asynchronously) before it stops the agent; whatever is left after that,
// from a failed run, is swept through the driver.
// With pools, the host keeps warm pools of those classes; it
// returns the agent too. The pool's sandboxes are not the sessions': once
// the agent has stopped, they are destroyed through the driver, and the
// benchmark fails if any is left.
func gvisorBenchHostWith(b testing.TB, srv *server.Server, pools []agent.PoolClass, edit ...func(*agent.Config)) (*containerd.Driver, *agent.Agent) {
	b.Helper()
	stateDir := b.TempDir()
	d := containerdtest.NewDriver(b, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: stateDir})
	b.Cleanup(func() { // runs last: the agent has stopped
		ctx := context.Background()
		refs, err := d.List(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range refs {
			if r.Labels[driver.PoolLabel] == "" {
				continue
			}
			if err := d.Destroy(ctx, r); err != nil {
				b.Errorf("destroying pooled sandbox %s: %v", r.ID, err)
			}
		}
		if refs, err = d.List(ctx); err != nil || len(refs) != 0 {
			b.Errorf("after the benchmark the driver holds %d sandboxes (%v)", len(refs), err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := srv.Hosts().IssueToken(ctx, time.Hour)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	cfg := agent.Config{
		HostID: "bench", ControlPlane: srv.HostAddr(), JoinToken: logging.Secret(tok.Reveal()), StateDir: b.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: containerd.RuntimeGVisor, DefaultLimits: containerd.DefaultLimits,
		Capacity: agent.Resources{CPUMillis: 64000, MemoryBytes: 256 << 30, DiskBytes: 1 << 40},
		Pools:    pools,
	}
	for _, e := range edit {
		e(&cfg)
	}
	a, err := agent.New(ctx, cfg)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	b.Cleanup(func() { cancel(); wg.Wait() })
	b.Cleanup(func() { // runs first
		if b.Failed() {
			return // sessions may be left undeleted; the sweep removes their sandboxes
		}
		// Destroyed means gone from the state dir too: a destroy removes
		// the container first and its host directories last, and the
		// agent must not stop in between.
		waitfor.State(b, time.Minute, "the host to destroy the deleted sessions' sandboxes", func() (bool, string) {
			refs, err := d.List(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			pooled := len(refs)
			refs = slices.DeleteFunc(refs, func(r driver.Ref) bool { return r.Labels[driver.PoolLabel] != "" })
			pooled -= len(refs)
			entries, err := os.ReadDir(stateDir)
			if err != nil {
				b.Fatal(err)
			}
			dirs := 0
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), "corral-") {
					dirs++
				}
			}
			return len(refs) == 0 && dirs == pooled, fmt.Sprintf("%d sandboxes left, %d sandbox directories for %d pooled sandboxes", len(refs), dirs, pooled)
		})
	})
	waitfor.Cond(b, 30*time.Second, "the host to connect", func() bool { return srv.Hosts().Connected("bench") })
	return d, a
}

func post(b *testing.B, c *http.Client, url string, v any) map[string]any {
	b.Helper()
	body, _ := json.Marshal(v)
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		b.Fatalf("POST %s: %d %v %v", url, resp.StatusCode, out, err)
	}
	return out
}

// benchStage starts a node with a gVisor host and makes an agent with the
// built-in toolset and an environment: it returns the host's driver, the
// API's base URL, a tenant's client, the agent and the environment.
func benchStage(b *testing.B) (*containerd.Driver, string, *http.Client, map[string]any, map[string]any) {
	b.Helper()
	d, _, base, c, ag, env := benchStageWith(b, nil)
	return d, base, c, ag, env
}

// benchStageWith is benchStage with the host's warm pool classes (and
// edits of the host agent's configuration); it returns the host agent too.
func benchStageWith(b testing.TB, pools []agent.PoolClass, edit ...func(*agent.Config)) (*containerd.Driver, *agent.Agent, string, *http.Client, map[string]any, map[string]any) {
	b.Helper()
	srv := servertest.Start(b, pgtest.New(b), server.Config{NodeID: "bench", SandboxRuntime: admission.RuntimeGVisor})
	d, a := gvisorBenchHostWith(b, srv, pools, edit...)
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(b, srv, tenant.Default))
	ag := postAny(b, c, base+"/v1/agents", map[string]any{"name": "bench", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	env := postAny(b, c, base+"/v1/environments", map[string]any{"name": "bench"})
	return d, a, base, c, ag, env
}

// sessionLimits are the limits a session's gVisor sandbox gets from the
// shipped policy, so that a raw baseline pays for the same sandbox (its
// workspace image above all: made and mounted at create).
func sessionLimits(b *testing.B) driver.Limits {
	b.Helper()
	pol, err := policy.Load()
	if err != nil {
		b.Fatal(err)
	}
	rt := pol.Runtimes[admission.RuntimeGVisor]
	return driver.Limits{CPUMillis: int64(rt.CPUMillis), MemoryBytes: int64(rt.MemoryMiB) << 20, Pids: int64(rt.Pids), DiskBytes: int64(rt.DiskMiB) << 20}
}

func BenchmarkSessionFirstToolResultCold(b *testing.B) {
	d, base, c, ag, env := benchStage(b)
	ctx := context.Background()
	limits := sessionLimits(b)

	var session, raw []time.Duration
	for i := range max(b.N, coldSamples) {
		start := time.Now()
		ref, err := d.Create(ctx, driver.Spec{Key: fmt.Sprintf("bench-raw-%d", i), Image: server.DefaultSandboxImage, Limits: limits})
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

		start = time.Now()
		id := post(b, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})["id"].(string)
		stream, err := c.Get(base + "/v1/sessions/" + id + "/events/stream?beta=true")
		if err != nil {
			b.Fatal(err)
		}
		frames := sseFrames(stream.Body)
		post(b, c, base+"/v1/sessions/"+id+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tool bash {"command":"true"}`}}},
		}})
		// next waits for the next frame on the stream, failing on an error.
		next := func(what string) sseFrame {
			f := waitfor.Chan(b, 2*time.Minute, what, frames)
			if f.event == "session.error" || f.event == "agent.tool_result" && f.data["is_error"] == true {
				b.Fatalf("%s %v", f.event, f.data)
			}
			return f
		}
		for next("the tool result").event != "agent.tool_result" {
		}
		session = append(session, time.Since(start))
		// A running session cannot be deleted (400): the turn ends first.
		for next("the session to go idle").event != "session.status_idle" {
		}
		stream.Body.Close()
		req, _ := http.NewRequest("DELETE", base+"/v1/sessions/"+id, nil)
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("DELETE session %s: %d", id, resp.StatusCode)
		}
	}
	report(b, "session", session, raw)
}

// quantile is the p-th percentile of ds.
func quantile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// report reports p50 and p99 of what was measured and of its raw baseline
// from the same run, and their ratios.
func report(b *testing.B, name string, ds, raw []time.Duration) {
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{name, ds}, {"raw", raw}} {
		b.ReportMetric(float64(quantile(m.ds, 50).Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(quantile(m.ds, 99).Microseconds())/1000, m.name+"-p99-ms")
	}
	b.ReportMetric(float64(quantile(ds, 50))/float64(quantile(raw, 50)), name+"/raw-p50")
	b.ReportMetric(float64(quantile(ds, 99))/float64(quantile(raw, 99)), name+"/raw-p99")
}

const warmSamples = 40

// BenchmarkWarmToolTurn: a turn of a session whose sandbox is running,
// through the public API: POST a user.message whose (fake) model calls
// bash `true`, until its agent.tool_result arrives on the event stream.
// The baseline, alternated with it in the same run: `true` run by the
// sandbox's own exec (a runsc exec through containerd) in another running
// gVisor sandbox. Targets: p50 within 10ms of the raw exec's, p99 within
// 2x the raw p99. A second baseline, `bash -c true` the same way, shows
// what is the bash tool's shell rather than corral's path; a third, `true`
// through the driver (its command server), what the driver's exec costs.
func BenchmarkWarmToolTurn(b *testing.B) {
	d, base, c, ag, env := benchStage(b)
	ctx := context.Background()

	ref, err := d.Create(ctx, driver.Spec{Key: "bench-raw-warm", Image: server.DefaultSandboxImage, Limits: sessionLimits(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Destroy(context.Background(), ref) })
	rawSB, err := d.Attach(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}

	id := post(b, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})["id"].(string)
	b.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", base+"/v1/sessions/"+id, nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	stream, err := c.Get(base + "/v1/sessions/" + id + "/events/stream?beta=true")
	if err != nil {
		b.Fatal(err)
	}
	defer stream.Body.Close()
	frames := sseFrames(stream.Body)
	next := func(what string) sseFrame {
		f := waitfor.Chan(b, 2*time.Minute, what, frames)
		if f.event == "session.error" || f.event == "agent.tool_result" && f.data["is_error"] == true {
			b.Fatalf("%s %v", f.event, f.data)
		}
		return f
	}
	turn := func() time.Duration {
		start := time.Now()
		post(b, c, base+"/v1/sessions/"+id+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tool bash {"command":"true"}`}}},
		}})
		for next("the tool result").event != "agent.tool_result" {
		}
		took := time.Since(start)
		for next("the session to go idle").event != "session.status_idle" {
		}
		return took
	}
	turn() // places the sandbox: the cold turn is not measured here
	turn() // and the sandbox's command server starts after its first
	var warm, raw, rawBash, viaDriver []time.Duration
	exec := func(argv ...string) time.Duration {
		start := time.Now()
		if err := containerdtest.RawExec(ctx, d, ref.ID, argv...); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range max(b.N, warmSamples) {
		raw = append(raw, exec("true"))
		rawBash = append(rawBash, exec("bash", "-c", "true"))
		start := time.Now()
		if _, err := rawSB.Exec(ctx, driver.ExecRequest{Command: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		viaDriver = append(viaDriver, time.Since(start))
		warm = append(warm, turn())
	}
	report(b, "turn", warm, raw)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(quantile(warm, 50)-quantile(raw, 50)), "turn-minus-raw-p50-ms")
	b.ReportMetric(ms(quantile(rawBash, 50)), "raw-bash-p50-ms")
	b.ReportMetric(ms(quantile(warm, 50)-quantile(rawBash, 50)), "turn-minus-raw-bash-p50-ms")
	b.ReportMetric(ms(quantile(viaDriver, 50)), "driver-exec-p50-ms")
}
