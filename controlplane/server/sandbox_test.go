package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/metrics/metricstest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
	"corral.dev/corral/test/processhost"
)

// startHost joins a host agent with the process driver to srv and waits
// until the node has its stream. stop stops the agent.
func startHost(t *testing.T, srv *server.Server, id string) (d *process.Driver, stop func()) {
	t.Helper()
	return startHostWith(t, srv, id, nil)
}

// startHostWith is startHost with the agent's configuration changed by
// edit (nil: none).
func startHostWith(t *testing.T, srv *server.Server, id string, edit func(*agent.Config)) (d *process.Driver, stop func()) {
	t.Helper()
	return processhost.Start(t, srv, id, edit)
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
	return newToolSessionOf(t, srv, tenant.Default)
}

// newToolSessionOf is newToolSession in tenant id.
func newToolSessionOf(t *testing.T, srv *server.Server, id tenant.ID) *session {
	t.Helper()
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, id))
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
	waitfor.Cond(s.t, time.Minute, "the turn to end", func() bool {
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
	d, _ := startHost(t, srv, "h1")
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
	waitfor.Cond(t, 30*time.Second, "the host to destroy the sandbox", func() bool { return sandboxCount(t, d) == 0 })

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
	waitfor.Cond(t, 30*time.Second, "the sweep to release the deleted session's placement", func() bool {
		_, _, ok := placement(srv, s2.id)
		return !ok
	})
	waitfor.Cond(t, 30*time.Second, "the host to destroy the swept sandbox", func() bool { return sandboxCount(t, d) == 0 })
}

// Without a host that has room for the session's sandbox, the tool call
// ends the turn with a clear session.error rather than waiting. (Without
// any host offering its class the session is not created: classes_test.)
func TestToolCallWithoutCapacityIsASessionError(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", MetricsAddr: "127.0.0.1:0"})
	// A gvisor host (a process agent claiming it) with too little memory
	// for one sandbox's request.
	startHostWith(t, srv, "small", func(c *agent.Config) {
		c.Runtime, c.Capacity = "gvisor", agent.Resources{CPUMillis: 4000, MemoryBytes: 16 << 20, DiskBytes: 8 << 30}
	})
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
	// The refusal shows in the node's metrics: a placement without room,
	// and a tool call that could not run.
	m := metricstest.Get(t, srv.MetricsURL())
	if v, _ := m.Value("corral_placements_total", map[string]string{"outcome": "no_capacity"}); v < 1 {
		t.Errorf("corral_placements_total{no_capacity} = %v, want at least 1 (outcomes: %v)", v, m.LabelValues("corral_placements_total", "outcome"))
	}
	if v, _ := m.Value("corral_tool_calls_total", map[string]string{"tool": "bash", "outcome": "failed"}); v < 1 {
		t.Errorf("corral_tool_calls_total{bash, failed} = %v, want at least 1", v)
	}
}

// A real model's session is not placed on a host that runs the process
// runtime (here one that offers gvisor too) without the unsafe override:
// the tool call ends the turn with a session.error and the placement is
// released.
func TestRealModelIsNotPlacedOnProcessHosts(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, f := range [][2]string{
			{"message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"usage":{"input_tokens":1,"output_tokens":1}}}`},
			{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"bash","input":{}}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"command\":\"true\"}"}}`},
			{"content_block_stop", `{"type":"content_block_stop","index":0}`},
			{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":1}}`},
			{"message_stop", `{"type":"message_stop"}`},
		} {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", f[0], f[1])
		}
	}))
	defer api.Close()
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", Model: "anthropic", AnthropicBaseURL: api.URL, AnthropicAPIKey: "k"})
	op := servertest.OperatorKey(t, db)
	if code, body := sendAs(t, op, "POST", "http://"+srv.HTTPAddr()+"/admin/v1/hosts",
		`{"id":"h1","runtimes":["gvisor","process"],"capacity":{"cpu_millis":8000,"memory_mib":16384,"disk_mib":16384}}`); code != 200 {
		t.Fatalf("register host: %d %s", code, body)
	}
	s := newToolSession(t, srv)
	var msg string
	for _, e := range s.turn("run true") {
		if e["type"] == "session.error" {
			msg = fmt.Sprint(e["error"].(map[string]any)["message"])
		}
	}
	if !strings.Contains(msg, "process runtime") || !strings.Contains(msg, "--unsafe-allow-process-runtime-with-real-model") {
		t.Fatalf("session.error message %q, want the process runtime refused", msg)
	}
	// Released by whichever placed it: the tool call, or the placement
	// its turn started in the background (fleet.Prepare), which under load
	// may place it after the turn has ended, and then releases it too.
	waitfor.Cond(t, time.Minute, "the refused placement to be released", func() bool {
		_, _, ok := placement(srv, s.id)
		return !ok
	})
}

// A sandbox lost with its host is placed anew on another host: the session
// gets a session.status_rescheduled event, and its workspace comes back
// from the snapshot of its last turn that changed it; the next tool
// result says so, naming the snapshot's time, once. A file deleted in a
// later turn stays deleted, and what a turn wrote after an earlier
// snapshot is there too (an increment over it). A sparse file larger than
// the snapshot's budget is left out, and the notice counts it.
func TestLostSandboxComesBackFromItsSnapshot(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: time.Second})
	_, stop1 := startHost(t, srv, "h1")
	s := newToolSession(t, srv)
	toolOutput(t, s.turn(`!tool bash {"command":"echo 42 > out.txt\nmkdir -p d\necho old > d/gone.txt\necho kept > d/kept.txt\ntruncate -s 5G huge"}`))
	toolOutput(t, s.turn(`!tool bash {"command":"echo 43 >> out.txt\nrm d/gone.txt"}`))
	toolOutput(t, s.turn(`!tool read {"file_path":"/workspace/out.txt"}`)) // changes nothing
	if h, _, _ := placement(srv, s.id); h != "h1" {
		t.Fatalf("placed on %q, want h1", h)
	}
	startHost(t, srv, "h2")
	stop1()
	waitfor.Cond(t, 30*time.Second, "the sandbox to move to h2", func() bool {
		h, _, _ := placement(srv, s.id)
		return h == "h2"
	})
	out := toolOutput(t, s.turn(`!tool bash {"command":"cat out.txt d/kept.txt\nls d"}`))
	if !strings.Contains(out, "lost with its host") || !strings.Contains(out, "restored from the snapshot taken at "+time.Now().UTC().Format("2006-01-02T")) ||
		!strings.Contains(out, "42\n43\nkept\nkept.txt") || strings.Contains(out, "gone.txt") || !strings.Contains(out, " 1 files could not be restored") {
		t.Fatalf("tool result after the host was lost: %q", out)
	}
	rescheduled := false
	for _, e := range s.events() {
		rescheduled = rescheduled || e["type"] == server.RescheduledEvent && e["to_host"] == "h2"
	}
	if !rescheduled {
		t.Fatal("no session.status_rescheduled event")
	}
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo again"}`)); strings.Contains(out, "restored") {
		t.Fatalf("the notice came twice: %q", out)
	}
}

// A sandbox its host evicts under memory pressure is released at once (its
// capacity and the tenant's quota are free again) after the workspace the
// host kept is taken as the session's snapshot, including what was written
// after the last turn; the next tool call gets a new sandbox with it, and a
// notice.
func TestEvictedSandboxComesBackFromItsSnapshot(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: 5 * time.Second})
	var pressed atomic.Bool
	d, _ := startHostWith(t, srv, "h1", func(c *agent.Config) {
		c.Pressure = func(context.Context) (agent.Pressure, error) { return agent.Pressure{Memory: pressed.Load()}, nil }
	})
	s := newToolSession(t, srv)
	toolOutput(t, s.turn(`!tool bash {"command":"echo in-turn > a.txt"}`))
	// Written after the turn's snapshot, as by a background process.
	ctx := context.Background()
	refs, err := d.List(ctx)
	if err != nil || len(refs) != 1 {
		t.Fatalf("the host's sandboxes: %+v, %v", refs, err)
	}
	sb, err := d.Attach(ctx, refs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "late.txt", []byte("after-turn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pressed.Store(true)
	waitfor.Cond(t, 30*time.Second, "the evicted sandbox's placement to be released", func() bool {
		_, _, ok := placement(srv, s.id)
		return !ok
	})
	pressed.Store(false)
	// Under pressure the host takes no new placements: the next call
	// waits for the host to report the pressure gone.
	waitfor.Cond(t, 30*time.Second, "h1 to be recorded without memory pressure", func() bool { return fsmHost(srv, "h1").Healthy() })
	srv.Raft().Read(func(v raftfsm.View) {
		if u := v.Usage(string(tenant.Default)); u.Sandboxes != 0 {
			t.Errorf("the tenant's usage after the eviction: %+v", u)
		}
		if h, _ := v.Host("h1"); h.Allocated.CPUMillis != 0 || h.Allocated.MemoryMiB != 0 {
			t.Errorf("h1 still holds %+v for the evicted sandbox", h.Allocated)
		}
	})
	out := toolOutput(t, s.turn(`!tool bash {"command":"cat a.txt late.txt"}`))
	if !strings.Contains(out, "evicted from its host") || !strings.Contains(out, "restored from the snapshot") || !strings.Contains(out, "in-turn\nafter-turn") {
		t.Fatalf("tool result after the eviction: %q", out)
	}
	t.Logf("after the eviction: %s", out)
}

// An operator's eviction takes the sandbox's workspace as the session's
// snapshot before it releases it, so what was written after the last turn
// comes back too, with a notice naming the eviction.
func TestOperatorEvictionKeepsTheWorkspace(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: 5 * time.Second})
	d, _ := startHost(t, srv, "h1")
	s := newToolSession(t, srv)
	toolOutput(t, s.turn(`!tool bash {"command":"echo in-turn > a.txt"}`))
	ctx := context.Background()
	refs, err := d.List(ctx)
	if err != nil || len(refs) != 1 {
		t.Fatalf("the host's sandboxes: %+v, %v", refs, err)
	}
	sb, err := d.Attach(ctx, refs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "late.txt", []byte("after-turn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	admin := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	if _, err := admin.EvictSandbox(ctx, &adminv1.EvictSandboxRequest{SessionId: s.id}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := placement(srv, s.id); ok {
		t.Fatal("the evicted sandbox is still placed")
	}
	out := toolOutput(t, s.turn(`!tool bash {"command":"cat a.txt late.txt"}`))
	if !strings.Contains(out, "evicted from its host by an operator") || !strings.Contains(out, "in-turn\nafter-turn") {
		t.Fatalf("tool result after the eviction: %q", out)
	}
}

// A sandbox lost before any turn changed its workspace is replaced by an
// empty one, and the next tool result says the files are gone.
func TestLostSandboxWithoutSnapshotIsReplacedEmpty(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: time.Second})
	_, stop1 := startHost(t, srv, "h1")
	s := newToolSession(t, srv)
	toolOutput(t, s.turn(`!tool read {"file_path":"/workspace/none.txt"}`))
	startHost(t, srv, "h2")
	stop1()
	waitfor.Cond(t, 30*time.Second, "the sandbox to move to h2", func() bool {
		h, _, _ := placement(srv, s.id)
		return h == "h2"
	})
	out := toolOutput(t, s.turn(`!tool bash {"command":"ls"}`))
	if !strings.Contains(out, "Files written earlier in this session are gone") || strings.Contains(out, "restored") {
		t.Fatalf("tool result after the host was lost: %q", out)
	}
}

// With the node's own fleet, sandbox limits reach the Raft FSM (where
// placement enforces them) and deleting a tenant releases its placements.
func TestFleetQuotaAndTenantReaper(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a"})
	servertest.TenantKey(t, srv, "tenant_a")
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	ctx := context.Background()
	for _, n := range []int32{1, 3, 1} { // the same value again after another still applies
		if _, err := admin.SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: "tenant_a", Overrides: &adminv1.QuotaOverride{ConcurrentSandboxes: &n}}); err != nil {
			t.Fatal(err)
		}
		var q scheduler.Quota
		srv.Raft().Read(func(v raftfsm.View) { q = v.Quota("tenant_a") })
		if q.ConcurrentSandboxes != int(n) {
			t.Fatalf("the FSM's quota %+v, want %d sandboxes", q, n)
		}
	}
	op := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr() + "/admin/v1"
	if code, body := sendAs(t, op, "POST", base+"/hosts", `{"id":"h1","runtimes":["gvisor"],"capacity":{"cpu_millis":4000,"memory_mib":8192,"disk_mib":8192}}`); code != 200 {
		t.Fatalf("register host: %d %s", code, body)
	}
	if code, body := sendAs(t, op, "POST", base+"/sandboxes", `{"tenant":"tenant_a","session_id":"k1","resources":{"cpu_millis":500,"memory_mib":512}}`); code != 200 {
		t.Fatalf("place: %d %s", code, body)
	}
	if _, err := admin.DeleteTenant(ctx, &adminv1.DeleteTenantRequest{TenantId: "tenant_a"}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := placement(srv, "k1"); ok {
		t.Fatal("the deleted tenant's placement is still there")
	}
}

// A tenant at its concurrent-sandbox quota: its next session's tool call
// ends in a session.error that names the quota, while another tenant's
// session still gets a sandbox; deleting the first session frees the quota
// for the waiting one.
func TestSandboxQuotaIsNamedAndFreedByDelete(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: 2 * time.Second})
	startHost(t, srv, "h1")
	one := int32(1)
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	if _, err := admin.SetQuota(context.Background(), &adminv1.SetQuotaRequest{TenantId: string(tenant.Default), Overrides: &adminv1.QuotaOverride{ConcurrentSandboxes: &one}}); err != nil {
		t.Fatal(err)
	}
	first, second := newToolSession(t, srv), newToolSession(t, srv)
	toolOutput(t, first.turn(`!tool bash {"command":"true"}`))

	// The second session's turn would need a second sandbox: refused with
	// 429 naming the quota, not retried by the SDKs, and nothing is stored.
	before := len(second.events())
	send := func(s *session) *http.Response {
		t.Helper()
		body := `{"events":[{"type":"user.message","content":[{"type":"text","text":"!tool bash {\"command\":\"true\"}"}]}]}`
		resp, err := s.c.Post(s.base+"/v1/sessions/"+s.id+"/events?beta=true", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := send(second)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || !strings.Contains(string(b), "quota concurrent_sandboxes exceeded") || resp.Header.Get("x-should-retry") != "false" {
		t.Fatalf("a turn past the sandbox quota: %d %s (x-should-retry %q), want 429 naming the quota", resp.StatusCode, b, resp.Header.Get("x-should-retry"))
	}
	if n := len(second.events()); n != before {
		t.Fatalf("a refused turn stored %d events", n-before)
	}
	// The first session holds its sandbox: its turns go on.
	toolOutput(t, first.turn(`!tool bash {"command":"true"}`))
	// A session whose agent has no sandbox tools needs none: not refused.
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	plainAgent := postJSON(t, c, first.base+"/v1/agents", map[string]any{"name": "plain", "model": "fake"})
	env := postJSON(t, c, first.base+"/v1/environments", map[string]any{"name": "plain-env"})
	plain := postJSON(t, c, first.base+"/v1/sessions", map[string]any{"agent": plainAgent["id"], "environment_id": env["id"]})
	resp = send(&session{t: t, c: c, base: first.base, id: plain["id"].(string)})
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a turn of an agent without sandbox tools: %d, want 200", resp.StatusCode)
	}

	// Another tenant is not held back by tenant_default's quota.
	other := newToolSessionOf(t, srv, "tenant_other")
	if out := toolOutput(t, other.turn(`!tool bash {"command":"echo other"}`)); !strings.Contains(out, "other") {
		t.Fatalf("the other tenant's tool call: %q", out)
	}

	req, _ := http.NewRequest("DELETE", first.base+"/v1/sessions/"+first.id, nil)
	resp, err := first.c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	if out := toolOutput(t, second.turn(`!tool bash {"command":"echo freed"}`)); !strings.Contains(out, "freed") {
		t.Fatalf("after the delete freed the quota: %q", out)
	}
}

// A turn of a session whose agent uses the sandbox tools places the
// sandbox as it starts (fleet.Prepare), so that the host makes it ready
// while the model writes its first answer: after a turn with no tool call
// the session is placed and its sandbox is on the host. A session whose
// agent has no sandbox tools gets none.
func TestTurnStartPlacesItsSandbox(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	d, _ := startHost(t, srv, "h1")

	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	plain := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "plain", "model": "fake"})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "prepare"})
	bare := &session{t: t, c: c, base: base, id: postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": plain["id"], "environment_id": env["id"]})["id"].(string)}
	bare.turn("!reply no tools here")

	s := newToolSession(t, srv)
	for _, e := range s.turn("!reply no tool call this turn") {
		if e["type"] == "agent.tool_use" {
			t.Fatalf("the turn called a tool: %v", e)
		}
	}
	waitfor.State(t, 30*time.Second, "the session's sandbox placed and on its host", func() (bool, string) {
		host, sb, ok := placement(srv, s.id)
		return ok && host == "h1" && sandboxCount(t, d) == 1, fmt.Sprintf("placement %s/%s %v, %d sandboxes on the host", host, sb, ok, sandboxCount(t, d))
	})
	if _, _, ok := placement(srv, bare.id); ok {
		t.Fatal("a session whose agent has no sandbox tools was placed")
	}
	// Its first tool call runs in the sandbox made for it.
	_, sandbox, _ := placement(srv, s.id)
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo ran"}`)); !strings.Contains(out, "ran") {
		t.Fatalf("the first tool call: %q", out)
	}
	if _, sb2, _ := placement(srv, s.id); sb2 != sandbox || sandboxCount(t, d) != 1 {
		t.Fatalf("the tool call used sandbox %s, not the prepared %s (%d on the host)", sb2, sandbox, sandboxCount(t, d))
	}
}
