package server_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/policy"
)

// gvisorPoolClass is a warm pool class of one sandbox that a session of
// the shipped policy's gvisor profile claims: the default image with that
// profile's limits.
func gvisorPoolClass(t testing.TB) agent.PoolClass {
	t.Helper()
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	prof := p.Runtimes[admission.RuntimeGVisor]
	return agent.PoolClass{Image: server.DefaultSandboxImage, Min: 1, Max: 1, Limits: driver.Limits{
		CPUMillis: int64(prof.CPUMillis), MemoryBytes: int64(prof.MemoryMiB) << 20,
		Pids: int64(prof.Pids), DiskBytes: int64(prof.DiskMiB) << 20,
	}}
}

// awaitPooled waits until a's pool holds a ready sandbox, and returns the
// pool's ids.
func awaitPooled(t testing.TB, a *agent.Agent) []string {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		changed := a.PoolChanged()
		if st := a.Pool()[0]; st.Ready > 0 {
			return st.IDs
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the warm pool did not fill in 2 minutes: %+v", a.Pool())
		}
	}
}

// awaitWarm waits until srv's state counts n warm sandboxes of image on
// host (its heartbeats reached the leader; a placement takes one at once):
// a new session's placement is warm only while there is one.
func awaitWarm(t testing.TB, srv *server.Server, host, image string, n int) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	key := scheduler.WarmKey(image, admission.RuntimeGVisor)
	for {
		changed := srv.Raft().Changed()
		warm := 0
		srv.Raft().Read(func(v raftfsm.View) {
			if h, ok := v.Host(host); ok {
				warm = h.Warm[key]
			}
		})
		if warm == n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("the control plane counts %d warm sandboxes of %s on host %s after 2 minutes, not %d", warm, image, host, n)
		}
	}
}

// sandboxOf is the id of the sandbox d holds for a session ("" if none).
func sandboxOf(t testing.TB, d *containerd.Driver, sessionID string) string {
	t.Helper()
	refs, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(refs, func(r driver.Ref) bool { return r.Key == sessionID }); i >= 0 {
		return refs[i].ID
	}
	return ""
}

// deleteSession deletes a session through the API.
func deleteSession(t testing.TB, c *http.Client, base, id string) {
	t.Helper()
	req, _ := http.NewRequest("DELETE", base+"/v1/sessions/"+id, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("DELETE session %s: %d", id, resp.StatusCode)
	}
}

// TestSessionCreateClaimsWarmSandboxGVisor: a session created while its
// host has a warm sandbox of its class claims it before any message is
// sent (fleet.PrepareWarm): the sandbox bound to its key is the pooled one,
// and its first tool call runs there. The pool refills once that call's
// command has ended (the refill waits for it: the hold is longer than the
// test). A session created while the pool was empty got no sandbox at its
// create: its first turn claims the refilled pool's sandbox.
func TestSessionCreateClaimsWarmSandboxGVisor(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor})
	d, a := gvisorBenchHostWith(t, srv, []agent.PoolClass{gvisorPoolClass(t)}, func(c *agent.Config) { c.PoolRefillHold = time.Hour })
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	ag := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "warm", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "warm"})
	newSession := func() string {
		return postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})["id"].(string)
	}
	// turn runs bash `echo <word>` in the session and returns its sandbox.
	turn := func(id, word string) {
		t.Helper()
		stream, err := c.Get(base + "/v1/sessions/" + id + "/events/stream?beta=true")
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Body.Close()
		frames := sseFrames(stream.Body)
		postJSON(t, c, base+"/v1/sessions/"+id+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tool bash {"command":"echo ` + word + `"}`}}},
		}})
		for {
			f := waitfor.Chan(t, 2*time.Minute, "the tool result", frames)
			if f.event == "session.error" {
				t.Fatalf("session.error %v", f.data)
			}
			if f.event == "agent.tool_result" {
				if text := textOf(f.data["content"]); f.data["is_error"] == true || text != word {
					t.Fatalf("tool result %q (error %v), want %q", text, f.data["is_error"], word)
				}
				break
			}
		}
		for waitfor.Chan(t, 2*time.Minute, "the session to go idle", frames).event != "session.status_idle" {
		}
	}
	del := func(id string) { deleteSession(t, c, base, id) }

	pool := awaitPooled(t, a)
	awaitWarm(t, srv, "bench", server.DefaultSandboxImage, 1)
	first := newSession()
	defer del(first)
	waitfor.State(t, 2*time.Minute, "the new session to hold the pooled sandbox", func() (bool, string) {
		sb := sandboxOf(t, d, first)
		return slices.Contains(pool, sb), "its sandbox: " + sb + ", the pool's: " + pool[0]
	})
	// The pool stays empty until the first session's first command ends:
	// a session created now finds no warm sandbox.
	awaitWarm(t, srv, "bench", server.DefaultSandboxImage, 0)
	second := newSession()
	defer del(second)
	if st := a.Pool()[0]; st.Ready != 0 {
		t.Fatalf("the pool refilled before the claimed sandbox's first command: %+v", st)
	}

	turn(first, "first")
	if sb := sandboxOf(t, d, first); !slices.Contains(pool, sb) {
		t.Fatalf("the first session's tool call ran in sandbox %q, not the pooled %v", sb, pool)
	}
	refilled := awaitPooled(t, a)
	if slices.Equal(refilled, pool) {
		t.Fatalf("the pool holds the claimed sandbox %v", pool)
	}
	// Had the second session been given a cold sandbox at its create, it
	// would be in that one now.
	turn(second, "second")
	if sb := sandboxOf(t, d, second); !slices.Contains(refilled, sb) {
		t.Fatalf("the second session's tool call ran in sandbox %q, not the refilled pool's %v", sb, refilled)
	}
}

// TestSessionClaimedAtCreatePausesWhenIdleGVisor: a session that claimed a
// warm sandbox at its create and sends nothing is idle like any other: its
// sandbox is paused after the idle interval (it does not hold the host's
// CPU and memory forever), and its first turn resumes it.
func TestSessionClaimedAtCreatePausesWhenIdleGVisor(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: 300 * time.Millisecond})
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir(), Pausable: true})
	a := joinAgent(t, srv, agent.Config{HostID: "warm", Driver: d, Runtime: containerd.RuntimeGVisor, Pools: []agent.PoolClass{gvisorPoolClass(t)}})
	pool := awaitPooled(t, a)
	awaitWarm(t, srv, "warm", server.DefaultSandboxImage, 1)

	s := newToolSession(t, srv)
	waitPlacement(t, srv, s.id, time.Minute, "the unused session's claimed sandbox to be paused", func(p scheduler.Placement, v raftfsm.View) bool {
		return p.Paused()
	})
	if sb := sandboxOf(t, d, s.id); !slices.Contains(pool, sb) {
		t.Fatalf("the session's sandbox is %q, not the pooled %v", sb, pool)
	}
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo resumed"}`)); !strings.Contains(out, "resumed") {
		t.Fatalf("the first turn after the pause: %q", out)
	}
}
