package publicapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// fixtures creates an agent (two versions) and an environment.
func fixtures(t testing.TB, a *testAPI) (agentID, envID string) {
	t.Helper()
	ag := a.ok("POST", "/v1/agents", map[string]any{
		"name": "helper", "model": "claude-haiku-4-5", "system": "v1",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}},
	})
	agentID = ag["id"].(string)
	a.ok("POST", "/v1/agents/"+agentID, map[string]any{"system": "v2"})
	env := a.ok("POST", "/v1/environments", map[string]any{"name": "env"})
	return agentID, env["id"].(string)
}

func TestSessionCreateAgentForms(t *testing.T) {
	a := setup(t, nil)
	agentID, envID := fixtures(t, a)
	tests := []struct {
		name    string
		agent   any
		version float64
		system  string
		check   func(t *testing.T, agent map[string]any)
	}{
		{"id string", agentID, 2, "v2", nil},
		{"reference latest", map[string]any{"type": "agent", "id": agentID}, 2, "v2", nil},
		{"reference version", map[string]any{"type": "agent", "id": agentID, "version": 1}, 1, "v1", nil},
		{"overrides", map[string]any{"type": "agent_with_overrides", "id": agentID, "version": 1, "system": "custom", "model": "claude-opus-4-8",
			"tools": []any{map[string]any{"type": "custom", "name": "ping", "description": "p", "input_schema": map[string]any{"type": "object"}}}}, 1, "custom",
			func(t *testing.T, agent map[string]any) {
				if agent["model"].(map[string]any)["id"] != "claude-opus-4-8" {
					t.Fatalf("model not overridden: %v", agent["model"])
				}
				tools := agent["tools"].([]any)
				if len(tools) != 1 || tools[0].(map[string]any)["name"] != "ping" {
					t.Fatalf("tools not overridden: %v", tools)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := a.ok("POST", "/v1/sessions", map[string]any{"agent": tc.agent, "environment_id": envID, "title": "t", "metadata": map[string]any{"k": "v"}})
			if !strings.HasPrefix(s["id"].(string), "sesn_") || s["type"] != "session" || s["status"] != "idle" || s["environment_id"] != envID || s["archived_at"] != nil {
				t.Fatalf("session = %v", s)
			}
			ag := s["agent"].(map[string]any)
			if ag["id"] != agentID || ag["version"] != tc.version || ag["system"] != tc.system || ag["type"] != "agent" || ag["name"] != "helper" {
				t.Fatalf("agent snapshot = %v", ag)
			}
			if _, ok := ag["metadata"]; ok {
				t.Fatalf("snapshot carries agent metadata: %v", ag)
			}
			for _, k := range []string{"resources", "vault_ids", "outcome_evaluations"} {
				if l, ok := s[k].([]any); !ok || len(l) != 0 {
					t.Fatalf("%s = %v", k, s[k])
				}
			}
			if s["budget"] != nil || s["deployment_id"] != nil || s["usage"] == nil || s["stats"] == nil {
				t.Fatalf("session = %v", s)
			}
			if tc.check != nil {
				tc.check(t, ag)
			}
		})
	}
}

func TestSessionCreateErrors(t *testing.T) {
	a := setup(t, nil)
	agentID, envID := fixtures(t, a)
	tests := []struct {
		name   string
		status int
		body   any
		want   string
	}{
		{"no agent", 400, map[string]any{"environment_id": envID}, "agent is required"},
		{"no environment", 400, map[string]any{"agent": agentID}, "environment_id is required"},
		{"agent type", 400, map[string]any{"agent": map[string]any{"type": "robot", "id": agentID}, "environment_id": envID}, "agent.type"},
		{"agent number", 400, map[string]any{"agent": 7, "environment_id": envID}, "agent: expected"},
		{"overrides on plain ref", 400, map[string]any{"agent": map[string]any{"type": "agent", "id": agentID, "system": "x"}, "environment_id": envID}, "agent_with_overrides"},
		{"override model null", 400, map[string]any{"agent": map[string]any{"type": "agent_with_overrides", "id": agentID, "model": nil}, "environment_id": envID}, "agent_model_required"},
		{"unknown agent", 404, map[string]any{"agent": "agent_missing", "environment_id": envID}, "agent_missing"},
		{"unknown version", 404, map[string]any{"agent": map[string]any{"type": "agent", "id": agentID, "version": 7}, "environment_id": envID}, "version 7"},
		{"unknown environment", 404, map[string]any{"agent": agentID, "environment_id": "env_missing"}, "env_missing"},
		{"initial events unsupported", 400, map[string]any{"agent": agentID, "environment_id": envID, "initial_events": []any{map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "hi"}}}}}, "initial_events"},
		{"initial event type", 400, map[string]any{"agent": agentID, "environment_id": envID, "initial_events": []any{map[string]any{"type": "user.interrupt"}}}, "initial_events[0].type"},
		{"resource of a missing file", 400, map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{map[string]any{"type": "file", "file_id": "file_1"}}}, "resources[0].file_id: no file file_1"},
		{"github_repository resource", 400, map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{map[string]any{"type": "github_repository", "url": "https://github.com/a/b"}}}, "needs the sandbox's network egress"},
		{"mount path outside uploads", 400, map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{map[string]any{"type": "file", "file_id": "file_1", "mount_path": "/workspace/x"}}}, "not beneath /mnt/session/uploads"},
		{"mount path with ..", 400, map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{map[string]any{"type": "file", "file_id": "file_1", "mount_path": "/mnt/session/uploads/../../etc/passwd"}}}, "must be clean"},
		{"relative mount path leaving the uploads", 400, map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{map[string]any{"type": "file", "file_id": "file_1", "mount_path": "../x.csv"}}}, "must be clean"},
		{"mount path too long", 400, map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{map[string]any{"type": "file", "file_id": "file_1", "mount_path": "/mnt/session/uploads/" + strings.Repeat("a/", 600)}}}, "at most 1024"},
		{"budget", 400, map[string]any{"agent": agentID, "environment_id": envID, "budget": map[string]any{"type": "limit"}}, "budget"},
		{"title type", 400, map[string]any{"agent": agentID, "environment_id": envID, "title": 3}, "title: expected a string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if msg := a.fail(tc.status, "POST", "/v1/sessions", tc.body); !strings.Contains(msg, tc.want) {
				t.Fatalf("message %q does not contain %q", msg, tc.want)
			}
		})
	}
	// Another tenant's agent and environment are not found.
	a.fail(404, "POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID}, "X-Test-Tenant", "tenant_b")
	// Archived agents and environments cannot start sessions.
	a.ok("POST", "/v1/environments/"+envID+"/archive", nil)
	a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID})
}

// fakeEvents records what it is asked to append.
type fakeEvents struct {
	mu   sync.Mutex
	got  map[string][]json.RawMessage
	fail bool
}

func (f *fakeEvents) AppendUserEvents(ctx context.Context, sessionID string, events []json.RawMessage) ([]json.RawMessage, error) {
	if _, err := tenant.Required(ctx); err != nil {
		return nil, err
	}
	if f.fail {
		return nil, errdefs.InvalidArgument("events[0]: rejected")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.got == nil {
		f.got = map[string][]json.RawMessage{}
	}
	f.got[sessionID] = append(f.got[sessionID], events...)
	return events, nil
}

func TestSessionInitialEvents(t *testing.T) {
	ev := &fakeEvents{}
	a := setup(t, ev)
	agentID, envID := fixtures(t, a)
	msg := map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "hi"}}}
	s := a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "initial_events": []any{msg, msg}})
	if n := len(ev.got[s["id"].(string)]); n != 2 {
		t.Fatalf("appender got %d events", n)
	}
	a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "initial_events": make([]any, 51)})
	// When the log refuses the events, the session is not left behind.
	ev.fail = true
	a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "initial_events": []any{msg}})
	if l := a.ok("GET", "/v1/sessions", nil); len(l["data"].([]any)) != 1 {
		t.Fatalf("sessions after a refused create: %v", l)
	}
}

func TestSessionListCursor(t *testing.T) {
	a := setup(t, nil)
	agentID, envID := fixtures(t, a)
	var ids []string // oldest first
	for i := range 7 {
		ref := any(agentID)
		if i%2 == 1 {
			ref = map[string]any{"type": "agent", "id": agentID, "version": 1}
		}
		s := a.ok("POST", "/v1/sessions", map[string]any{"agent": ref, "environment_id": envID, "title": fmt.Sprint(i)})
		ids = append(ids, s["id"].(string))
	}
	idsOf := func(p map[string]any) []string {
		var out []string
		for _, d := range p["data"].([]any) {
			out = append(out, d.(map[string]any)["id"].(string))
		}
		return out
	}
	// Newest first (the default), forward.
	p1 := a.ok("GET", "/v1/sessions?limit=3", nil)
	if got := idsOf(p1); fmt.Sprint(got) != fmt.Sprint([]string{ids[6], ids[5], ids[4]}) || p1["prev_page"] != nil || p1["next_page"] == nil {
		t.Fatalf("page 1 = %v (prev %v)", got, p1["prev_page"])
	}
	p2 := a.ok("GET", "/v1/sessions?limit=3&page="+p1["next_page"].(string), nil)
	if got := idsOf(p2); fmt.Sprint(got) != fmt.Sprint([]string{ids[3], ids[2], ids[1]}) || p2["prev_page"] == nil {
		t.Fatalf("page 2 = %v", got)
	}
	p3 := a.ok("GET", "/v1/sessions?limit=3&page="+p2["next_page"].(string), nil)
	if got := idsOf(p3); fmt.Sprint(got) != fmt.Sprint([]string{ids[0]}) || p3["next_page"] != nil {
		t.Fatalf("page 3 = %v next %v", got, p3["next_page"])
	}
	// And back.
	b2 := a.ok("GET", "/v1/sessions?limit=3&page="+p3["prev_page"].(string), nil)
	if got := idsOf(b2); fmt.Sprint(got) != fmt.Sprint([]string{ids[3], ids[2], ids[1]}) || b2["prev_page"] == nil || b2["next_page"] == nil {
		t.Fatalf("back to page 2 = %v", got)
	}
	b1 := a.ok("GET", "/v1/sessions?limit=3&page="+b2["prev_page"].(string), nil)
	if got := idsOf(b1); fmt.Sprint(got) != fmt.Sprint([]string{ids[6], ids[5], ids[4]}) || b1["prev_page"] != nil {
		t.Fatalf("back to page 1 = %v prev %v", got, b1["prev_page"])
	}
	// Oldest first.
	asc := a.ok("GET", "/v1/sessions?order=asc&limit=4", nil)
	if got := idsOf(asc); fmt.Sprint(got) != fmt.Sprint(ids[:4]) {
		t.Fatalf("asc = %v", got)
	}
	// A cursor keeps its order.
	if msg := a.fail(400, "GET", "/v1/sessions?order=desc&page="+asc["next_page"].(string), nil); !strings.Contains(msg, "order") {
		t.Fatalf("order mismatch message %q", msg)
	}
	// Filters.
	if got := idsOf(a.ok("GET", "/v1/sessions?agent_id="+agentID+"&agent_version=1", nil)); len(got) != 3 {
		t.Fatalf("agent_version=1: %v", got)
	}
	a.fail(400, "GET", "/v1/sessions?agent_version=1", nil)
	if got := idsOf(a.ok("GET", "/v1/sessions?statuses[]=running&statuses[]=terminated", nil)); len(got) != 0 {
		t.Fatalf("statuses: %v", got)
	}
	if got := idsOf(a.ok("GET", "/v1/sessions?statuses[]=idle", nil)); len(got) != 7 {
		t.Fatalf("statuses idle: %v", got)
	}
	a.fail(400, "GET", "/v1/sessions?statuses[]=sleeping", nil)
	a.fail(400, "GET", "/v1/sessions?order=sideways", nil)
	if got := idsOf(a.ok("GET", "/v1/sessions?created_at[gt]=2999-01-01T00:00:00Z", nil)); len(got) != 0 {
		t.Fatalf("created_at[gt]: %v", got)
	}
	if got := idsOf(a.ok("GET", "/v1/sessions?created_at[lt]=2999-01-01T00:00:00Z&created_at[gte]=2000-01-01T00:00:00Z", nil)); len(got) != 7 {
		t.Fatalf("created_at range: %v", got)
	}
	if got := idsOf(a.ok("GET", "/v1/sessions", nil, "X-Test-Tenant", "tenant_b")); len(got) != 0 {
		t.Fatalf("other tenant: %v", got)
	}
}

func TestSessionUpdateArchiveDelete(t *testing.T) {
	a := setup(t, nil)
	agentID, envID := fixtures(t, a)
	s := a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "metadata": map[string]any{"a": "1", "b": "2"}})
	id := s["id"].(string)
	up := a.ok("POST", "/v1/sessions/"+id, map[string]any{"title": "renamed", "metadata": map[string]any{"a": nil, "c": "3"}})
	if up["title"] != "renamed" || fmt.Sprint(up["metadata"]) != "map[b:2 c:3]" {
		t.Fatalf("updated %v", up)
	}
	// Omitted metadata is preserved; title null clears.
	up = a.ok("POST", "/v1/sessions/"+id, map[string]any{"title": nil})
	if up["title"] != nil || fmt.Sprint(up["metadata"]) != "map[b:2 c:3]" {
		t.Fatalf("updated %v", up)
	}
	up = a.ok("POST", "/v1/sessions/"+id, map[string]any{"agent": map[string]any{
		"tools":       []any{map[string]any{"type": "mcp_toolset", "mcp_server_name": "s"}},
		"mcp_servers": []any{map[string]any{"type": "url", "name": "s", "url": "https://s.example/mcp"}},
	}})
	ag := up["agent"].(map[string]any)
	if len(ag["tools"].([]any)) != 1 || len(ag["mcp_servers"].([]any)) != 1 || ag["system"] != "v2" {
		t.Fatalf("agent after update = %v", ag)
	}
	// Each update that changed something left one session.updated event.
	a.ok("POST", "/v1/sessions/"+id, map[string]any{"metadata": map[string]any{}})
	ctx := tenant.With(context.Background(), tenant.Default)
	evs, err := a.store.Events().List(ctx, id, store.EventQuery{})
	if err != nil || len(evs) != 3 {
		t.Fatalf("events after updates: %d, %v", len(evs), err)
	}
	var first, last map[string]any
	_ = json.Unmarshal(evs[0].JSON, &first)
	_ = json.Unmarshal(evs[2].JSON, &last)
	if first["type"] != "session.updated" || first["title"] != "renamed" || fmt.Sprint(first["metadata"]) != "map[b:2 c:3]" || first["agent"] != nil || first["processed_at"] == nil {
		t.Fatalf("first session.updated = %s", evs[0].JSON)
	}
	if _, ok := last["agent"].(map[string]any); !ok || last["title"] != nil || last["metadata"] != nil {
		t.Fatalf("last session.updated = %s", evs[2].JSON)
	}
	a.fail(400, "POST", "/v1/sessions/"+id, map[string]any{"agent": map[string]any{"system": "no"}})
	a.fail(400, "POST", "/v1/sessions/"+id, map[string]any{"vault_ids": []string{"vlt_1"}})
	a.fail(400, "POST", "/v1/sessions/"+id, map[string]any{"metadata": manyPairs(17)})
	a.fail(404, "POST", "/v1/sessions/"+id, map[string]any{"title": "x"}, "X-Test-Tenant", "tenant_b")
	a.fail(404, "GET", "/v1/sessions/sesn_missing", nil)

	ar := a.ok("POST", "/v1/sessions/"+id+"/archive", nil)
	if ar["archived_at"] == nil {
		t.Fatalf("archive = %v", ar)
	}
	a.fail(409, "POST", "/v1/sessions/"+id, map[string]any{"title": "x"})
	if l := a.ok("GET", "/v1/sessions", nil); len(l["data"].([]any)) != 0 {
		t.Fatalf("list without archived: %v", l)
	}
	if l := a.ok("GET", "/v1/sessions?include_archived=true", nil); len(l["data"].([]any)) != 1 {
		t.Fatalf("list with archived: %v", l)
	}
	a.fail(404, "DELETE", "/v1/sessions/"+id, nil, "X-Test-Tenant", "tenant_b")
	del := a.ok("DELETE", "/v1/sessions/"+id, nil)
	if del["id"] != id || del["type"] != "session_deleted" {
		t.Fatalf("delete = %v", del)
	}
	a.fail(404, "GET", "/v1/sessions/"+id, nil)
	// The environment is free to go now.
	a.ok("DELETE", "/v1/environments/"+envID, nil)
}

func TestRunningSession(t *testing.T) {
	a := setup(t, nil)
	agentID, envID := fixtures(t, a)
	id := a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID})["id"].(string)
	a.sql(`UPDATE sessions SET status = 'running' WHERE id = $1`, id)
	if msg := a.fail(400, "DELETE", "/v1/sessions/"+id, nil); !strings.Contains(msg, "running") {
		t.Fatalf("delete running: %q", msg)
	}
	a.fail(400, "POST", "/v1/sessions/"+id+"/archive", nil)
	a.fail(409, "POST", "/v1/sessions/"+id, map[string]any{"agent": map[string]any{"tools": []any{}}})
	// Title and metadata may change while running.
	if s := a.ok("POST", "/v1/sessions/"+id, map[string]any{"title": "busy"}); s["status"] != "running" || s["title"] != "busy" {
		t.Fatalf("update running = %v", s)
	}
	if l := a.ok("GET", "/v1/sessions?statuses[]=running", nil); len(l["data"].([]any)) != 1 {
		t.Fatalf("statuses=running: %v", l)
	}
}
