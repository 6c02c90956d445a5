package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/logging"
)

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by the deadline
	}
}

// startHost joins a host agent with the process driver to srv and waits
// until the node has its stream.
func startHost(t *testing.T, srv *server.Server, id string) *process.Driver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := srv.Hosts().IssueToken(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(ctx, agent.Config{
		HostID: id, ControlPlane: srv.HostAddr(), JoinToken: logging.Secret(tok.Reveal()), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: "process",
		Capacity:       agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30},
		ReconnectDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitUntil(t, 15*time.Second, "host "+id+" connected", func() bool { return srv.Hosts().Connected(id) })
	return d
}

// session is a session of an agent with the built-in toolset.
type session struct {
	t    *testing.T
	c    *http.Client
	base string
	id   string
}

func newToolSession(t *testing.T, srv *server.Server) *session {
	t.Helper()
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	ag := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "a", "model": "fake", "tools": []any{map[string]any{
		"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}},
	}}})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": fmt.Sprintf("e-%d", time.Now().UnixNano())})
	s := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})
	return &session{t: t, c: c, base: base, id: s["id"].(string)}
}

// events lists the session's events.
func (s *session) events() []map[string]any {
	s.t.Helper()
	resp, err := s.c.Get(s.base + "/v1/sessions/" + s.id + "/events?beta=true&limit=1000")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct{ Data []map[string]any }
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != 200 {
		s.t.Fatalf("listing events: %d %v", resp.StatusCode, err)
	}
	return page.Data
}

// turn sends a user message and returns the events of the turn once the
// session is idle again.
func (s *session) turn(text string) []map[string]any {
	s.t.Helper()
	before := len(s.events())
	postJSON(s.t, s.c, s.base+"/v1/sessions/"+s.id+"/events?beta=true", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": text}}},
	}})
	var evs []map[string]any
	waitUntil(s.t, time.Minute, "the turn to end", func() bool {
		evs = s.events()[before:]
		for _, e := range evs {
			if e["type"] == "session.status_idle" {
				return true
			}
		}
		return false
	})
	return evs
}

// toolOutput is the text of the turn's agent.tool_result, failing the test
// on a session.error.
func toolOutput(t *testing.T, evs []map[string]any) string {
	t.Helper()
	var out strings.Builder
	found := false
	for _, e := range evs {
		switch e["type"] {
		case "session.error":
			t.Fatalf("session error: %v", e["error"])
		case "agent.tool_result":
			found = true
			for _, b := range e["content"].([]any) {
				out.WriteString(fmt.Sprint(b.(map[string]any)["text"]))
			}
		}
	}
	if !found {
		t.Fatalf("no agent.tool_result in %v", evs)
	}
	return out.String()
}

func placement(srv *server.Server, key string) (hostID, sandboxID string, ok bool) {
	srv.Raft().Read(func(v raftfsm.View) {
		if p, found := v.Placement(key); found {
			hostID, sandboxID, ok = p.HostID, p.SandboxID, true
		}
	})
	return
}

func sandboxCount(t *testing.T, d *process.Driver) int {
	t.Helper()
	refs, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(refs)
}

// A session's tool calls run in its sandbox on a real host agent: placed
// on the first call, reused (with its files) by the next turn, destroyed on
// the host when the session is deleted.
func TestSessionToolsRunInItsSandbox(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: 2 * time.Second, SweepInterval: 200 * time.Millisecond})
	d := startHost(t, srv, "h1")
	s := newToolSession(t, srv)

	out := toolOutput(t, s.turn(`!tool bash {"command":"echo 42 > out.txt && echo hi from $(pwd)"}`))
	if !strings.Contains(out, "hi from") || !strings.Contains(out, "workspace") {
		t.Fatalf("turn 1 tool result: %q", out)
	}
	host, sandbox, ok := placement(srv, s.id)
	if !ok || host != "h1" || sandboxCount(t, d) != 1 {
		t.Fatalf("after turn 1: placement %s/%s %v, %d sandboxes on the host", host, sandbox, ok, sandboxCount(t, d))
	}

	if out := toolOutput(t, s.turn(`!tool bash {"command":"cat out.txt"}`)); !strings.Contains(out, "42") {
		t.Fatalf("turn 2 did not read turn 1's file: %q", out)
	}
	if h2, sb2, _ := placement(srv, s.id); h2 != host || sb2 != sandbox || sandboxCount(t, d) != 1 {
		t.Fatalf("turn 2 used another sandbox: %s/%s, was %s/%s", h2, sb2, host, sandbox)
	}

	req, _ := http.NewRequest("DELETE", s.base+"/v1/sessions/"+s.id, nil)
	resp, err := s.c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, _, ok := placement(srv, s.id); ok {
		t.Fatal("the deleted session is still placed")
	}
	waitUntil(t, 15*time.Second, "the host to destroy the sandbox", func() bool { return sandboxCount(t, d) == 0 })

	// A session deleted behind the server's back (as if the node crashed
	// between the delete and the release): the leader's sweep releases its
	// placement and the host destroys the sandbox.
	s2 := newToolSession(t, srv)
	toolOutput(t, s2.turn(`!tool bash {"command":"true"}`))
	if _, _, ok := placement(srv, s2.id); !ok || sandboxCount(t, d) != 1 {
		t.Fatal("the second session has no sandbox")
	}
	conn, err := pgx.Connect(context.Background(), db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `DELETE FROM sessions WHERE id = $1`, s2.id); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 15*time.Second, "the sweep to release the deleted session's placement", func() bool {
		_, _, ok := placement(srv, s2.id)
		return !ok
	})
	waitUntil(t, 15*time.Second, "the host to destroy the swept sandbox", func() bool { return sandboxCount(t, d) == 0 })
}

// Without a host that can run the session's sandbox, the tool call ends the
// turn with a clear session.error rather than waiting.
func TestToolCallWithoutCapacityIsASessionError(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a"})
	s := newToolSession(t, srv)
	var msg string
	for _, e := range s.turn(`!tool bash {"command":"true"}`) {
		if e["type"] == "session.error" {
			msg = fmt.Sprint(e["error"].(map[string]any)["message"])
		}
	}
	if !strings.Contains(msg, "no sandbox capacity") {
		t.Fatalf("session.error message %q, want one about sandbox capacity", msg)
	}
}
