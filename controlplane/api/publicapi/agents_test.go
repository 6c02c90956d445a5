package publicapi

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func TestAgentLifecycle(t *testing.T) {
	a := setup(t, nil)
	ag := a.ok("POST", "/v1/agents", map[string]any{
		"name":  "coder",
		"model": "claude-sonnet-4-6",
		"tools": []any{
			map[string]any{"type": "agent_toolset_20260401", "configs": []any{
				map[string]any{"name": "bash", "permission_policy": map[string]any{"type": "always_ask"}},
				map[string]any{"name": "web_fetch", "enabled": false},
			}},
			map[string]any{"type": "custom", "name": "lookup", "description": "find things", "input_schema": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}, "required": []string{"q"}}},
			map[string]any{"type": "mcp_toolset", "mcp_server_name": "docs"},
		},
		"mcp_servers": []any{map[string]any{"type": "url", "name": "docs", "url": "https://mcp.example.com/mcp"}},
		"skills":      []any{},
		"metadata":    map[string]any{"team": "a"},
	})
	id := ag["id"].(string)
	if !strings.HasPrefix(id, "agent_") || ag["type"] != "agent" || ag["version"] != 1.0 || ag["archived_at"] != nil {
		t.Fatalf("created %v", ag)
	}
	model := ag["model"].(map[string]any)
	if model["id"] != "claude-sonnet-4-6" || model["speed"] != "standard" || model["effort"].(map[string]any)["type"] != "high" {
		t.Fatalf("model = %v", model)
	}
	tools := ag["tools"].([]any)
	ts := tools[0].(map[string]any)
	if ts["default_config"].(map[string]any)["permission_policy"].(map[string]any)["type"] != "always_allow" {
		t.Fatalf("toolset default = %v", ts["default_config"])
	}
	configs := ts["configs"].([]any)
	if len(configs) != 8 {
		t.Fatalf("resolved configs = %v", configs)
	}
	for _, c := range configs {
		c := c.(map[string]any)
		policy := c["permission_policy"].(map[string]any)["type"]
		switch c["name"] {
		case "bash":
			if policy != "always_ask" || c["enabled"] != true {
				t.Fatalf("bash = %v", c)
			}
		case "web_fetch":
			if c["enabled"] != false || policy != "always_allow" {
				t.Fatalf("web_fetch = %v", c)
			}
			if _, ok := c["url_sources"]; !ok {
				t.Fatalf("web_fetch lacks url_sources: %v", c)
			}
		default:
			if policy != "always_allow" || c["enabled"] != true || c["type"] != c["name"] {
				t.Fatalf("%v", c)
			}
		}
	}
	mcp := tools[2].(map[string]any)
	if mcp["default_config"].(map[string]any)["permission_policy"].(map[string]any)["type"] != "always_ask" {
		t.Fatalf("mcp toolset default = %v", mcp)
	}
	if sk := ag["skills"].([]any); len(sk) != 0 {
		t.Fatalf("skills = %v", sk)
	}

	// Update to version 2 with the current version; metadata is a patch.
	v2 := a.ok("POST", "/v1/agents/"+id, map[string]any{"version": 1, "system": "be brief", "metadata": map[string]any{"team": nil, "tier": "gold"}})
	if v2["version"] != 2.0 || v2["system"] != "be brief" || fmt.Sprint(v2["metadata"]) != "map[tier:gold]" || v2["name"] != "coder" {
		t.Fatalf("v2 = %v", v2)
	}
	// A stale version is a conflict that must not be retried.
	r := a.do("POST", "/v1/agents/"+id, map[string]any{"version": 1, "system": "x"})
	if r.status != http.StatusConflict || r.header.Get("x-should-retry") != "false" {
		t.Fatalf("stale update: %d %v %s", r.status, r.header, r.body)
	}
	r.errMsg(t)
	// An update that changes nothing makes no version.
	if same := a.ok("POST", "/v1/agents/"+id, map[string]any{"system": "be brief"}); same["version"] != 2.0 {
		t.Fatalf("no-op update made version %v", same["version"])
	}
	// Model as an object, effort as a bare string (only its default is
	// accepted: unsupported.go).
	v3 := a.ok("POST", "/v1/agents/"+id, map[string]any{"model": map[string]any{"id": "claude-opus-4-8", "effort": "high", "speed": "standard"}, "description": nil})
	if m := v3["model"].(map[string]any); m["id"] != "claude-opus-4-8" || m["effort"].(map[string]any)["type"] != "high" || m["speed"] != "standard" || v3["version"] != 3.0 {
		t.Fatalf("v3 = %v", v3)
	}
	old := a.ok("GET", "/v1/agents/"+id+"?version=1", nil)
	if old["version"] != 1.0 || old["system"] != "" {
		t.Fatalf("version 1 = %v", old)
	}
	a.fail(404, "GET", "/v1/agents/"+id+"?version=9", nil)
	a.fail(400, "GET", "/v1/agents/"+id+"?version=x", nil)

	versions := a.ok("GET", "/v1/agents/"+id+"/versions?limit=2", nil)
	data := versions["data"].([]any)
	if len(data) != 2 || data[0].(map[string]any)["version"] != 3.0 || versions["next_page"] == nil {
		t.Fatalf("versions page 1 = %v", versions)
	}
	versions = a.ok("GET", "/v1/agents/"+id+"/versions?limit=2&page="+versions["next_page"].(string), nil)
	if data := versions["data"].([]any); len(data) != 1 || data[0].(map[string]any)["version"] != 1.0 || versions["next_page"] != nil {
		t.Fatalf("versions page 2 = %v", versions)
	}

	// Another tenant sees none of it.
	a.fail(404, "GET", "/v1/agents/"+id, nil, "X-Test-Tenant", "tenant_b")
	a.fail(404, "POST", "/v1/agents/"+id, map[string]any{"name": "x"}, "X-Test-Tenant", "tenant_b")
	a.fail(404, "GET", "/v1/agents/agent_nothing", nil)

	arch := a.ok("POST", "/v1/agents/"+id+"/archive", nil)
	if arch["archived_at"] == nil {
		t.Fatalf("archived = %v", arch)
	}
	a.fail(409, "POST", "/v1/agents/"+id, map[string]any{"name": "x"})
	if l := a.ok("GET", "/v1/agents", nil); len(l["data"].([]any)) != 0 || l["next_page"] != nil {
		t.Fatalf("list = %v", l)
	}
	if l := a.ok("GET", "/v1/agents?include_archived=true", nil); len(l["data"].([]any)) != 1 {
		t.Fatalf("list with archived = %v", l)
	}
}

func TestAgentListPaging(t *testing.T) {
	a := setup(t, nil)
	for i := range 5 {
		a.ok("POST", "/v1/agents", map[string]any{"name": fmt.Sprint("a", i), "model": "m"})
	}
	seen := map[string]bool{}
	path := "/v1/agents?limit=2"
	for range 10 {
		p := a.ok("GET", path, nil)
		for _, d := range p["data"].([]any) {
			seen[d.(map[string]any)["id"].(string)] = true
		}
		if p["next_page"] == nil {
			break
		}
		path = "/v1/agents?limit=2&page=" + p["next_page"].(string)
	}
	if len(seen) != 5 {
		t.Fatalf("paging saw %d agents", len(seen))
	}
	if p := a.ok("GET", "/v1/agents?created_at[gte]=2999-01-01T00:00:00Z", nil); len(p["data"].([]any)) != 0 {
		t.Fatalf("created_at[gte] filter: %v", p)
	}
	a.fail(400, "GET", "/v1/agents?created_at[lte]=yesterday", nil)
	a.fail(400, "GET", "/v1/agents?limit=0", nil)
	a.fail(400, "GET", "/v1/agents?page=garbage", nil)
	// A cursor from another list is refused.
	a.ok("POST", "/v1/environments", map[string]any{"name": "e1"})
	a.ok("POST", "/v1/environments", map[string]any{"name": "e2"})
	envs := a.ok("GET", "/v1/environments?limit=1", nil)
	a.fail(400, "GET", "/v1/agents?page="+envs["next_page"].(string), nil)
}

func TestAgentValidation(t *testing.T) {
	a := setup(t, nil)
	long := strings.Repeat("x", 257)
	toolset := map[string]any{"type": "agent_toolset_20260401"}
	tests := []struct {
		name string
		body any
		want string // in the message
	}{
		{"malformed", `{"name":`, "not valid JSON"},
		{"not an object", `[1]`, "must be a JSON object"},
		{"trailing data", `{"name":"a","model":"m"} {}`, "unexpected data"},
		{"unknown field", `{"name":"a","model":"m","colour":1}`, `"colour"`},
		{"no name", map[string]any{"model": "m"}, "name is required"},
		{"empty name", map[string]any{"name": "", "model": "m"}, "name must not be empty"},
		{"long name", map[string]any{"name": long, "model": "m"}, "name must be at most 256"},
		{"name wrong type", map[string]any{"name": 5, "model": "m"}, "name: expected a string"},
		{"no model", map[string]any{"name": "a"}, "model is required"},
		{"model null", map[string]any{"name": "a", "model": nil}, "model cannot be null"},
		{"model number", map[string]any{"name": "a", "model": 4}, "model: expected"},
		{"model no id", map[string]any{"name": "a", "model": map[string]any{"speed": "fast"}}, "model.id is required"},
		{"bad effort", map[string]any{"name": "a", "model": map[string]any{"id": "m", "effort": "extreme"}}, "model.effort"},
		{"bad speed", map[string]any{"name": "a", "model": map[string]any{"id": "m", "speed": "ludicrous"}}, "model.speed"},
		{"long description", map[string]any{"name": "a", "model": "m", "description": strings.Repeat("d", 2049)}, "description must be at most 2048"},
		{"long system", map[string]any{"name": "a", "model": "m", "system": strings.Repeat("s", 100_001)}, "system must be at most 100000"},
		{"tool type", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{"type": "hammer"}}}, `tools[0].type: "hammer"`},
		{"tool no type", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{}}}, "tools[0].type is required"},
		{"two toolsets", map[string]any{"name": "a", "model": "m", "tools": []any{toolset, toolset}}, "only one"},
		{"unknown builtin", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{"type": "agent_toolset_20260401", "configs": []any{map[string]any{"name": "sudo"}}}}}, `tools[0].configs[0].name: "sudo"`},
		{"bad policy", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "sometimes"}}}}}, "permission_policy.type"},
		{"custom schema type", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{"type": "custom", "name": "t", "description": "d", "input_schema": map[string]any{"type": "string"}}}}, "input_schema.type"},
		{"custom bad name", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{"type": "custom", "name": "a b", "description": "d", "input_schema": map[string]any{}}}}, "tools[0].name"},
		{"mcp unknown server", map[string]any{"name": "a", "model": "m", "tools": []any{map[string]any{"type": "mcp_toolset", "mcp_server_name": "x"}}}, `no MCP server named "x"`},
		{"mcp unreferenced", map[string]any{"name": "a", "model": "m", "mcp_servers": []any{map[string]any{"type": "url", "name": "x", "url": "https://x.example"}}}, "not referenced"},
		{"mcp dup names", map[string]any{"name": "a", "model": "m", "mcp_servers": []any{map[string]any{"name": "x", "url": "https://x.example"}, map[string]any{"name": "x", "url": "https://y.example"}}}, "unique"},
		{"mcp bad url", map[string]any{"name": "a", "model": "m", "mcp_servers": []any{map[string]any{"name": "x", "url": "ftp://x"}}}, "mcp_servers[0].url"},
		{"too many mcp", map[string]any{"name": "a", "model": "m", "mcp_servers": make([]any, 21)}, "at most 20"},
		{"skills not a list", map[string]any{"name": "a", "model": "m", "skills": "pdf"}, "skills: expected an array"},
		{"too many skills", map[string]any{"name": "a", "model": "m", "skills": make([]any, 21)}, "at most 20"},
		{"multiagent", map[string]any{"name": "a", "model": "m", "multiagent": map[string]any{"type": "coordinator", "agents": []any{}}}, "multiagent"},
		{"metadata too many", map[string]any{"name": "a", "model": "m", "metadata": manyPairs(17)}, "at most 16"},
		{"metadata long key", map[string]any{"name": "a", "model": "m", "metadata": map[string]any{strings.Repeat("k", 65): "v"}}, "at most 64"},
		{"metadata long value", map[string]any{"name": "a", "model": "m", "metadata": map[string]any{"k": strings.Repeat("v", 513)}}, "at most 512"},
		{"metadata not string", map[string]any{"name": "a", "model": "m", "metadata": map[string]any{"k": 1}}, "metadata"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := a.fail(400, "POST", "/v1/agents", tc.body)
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("message %q does not contain %q", msg, tc.want)
			}
		})
	}
}

func manyPairs(n int) map[string]any {
	m := map[string]any{}
	for i := range n {
		m[fmt.Sprint("k", i)] = "v"
	}
	return m
}

func TestWireConventions(t *testing.T) {
	a := setup(t, nil)
	// Oversized bodies are 413.
	big := `{"name":"a","model":"m","system":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	a.fail(413, "POST", "/v1/agents", big)
	// Unknown routes under /v1/ get the envelope.
	a.fail(404, "GET", "/v1/nothing", nil)
	// Empty body.
	a.fail(400, "POST", "/v1/agents", "")
}

// PostgreSQL stores neither NUL nor invalid UTF-8: such input is the
// client's error (or names nothing), never a 500.
func TestUnstorableText(t *testing.T) {
	a := setup(t, nil)
	for _, p := range []string{"/v1/agents/%00", "/v1/agents/%ff", "/v1/sessions/%00x", "/v1/environments/%c3%28", "/v1/agents/a.b"} {
		a.fail(404, "GET", p, nil)
	}
	a.fail(400, "GET", "/v1/sessions?agent_id=%ff", nil)
	for _, b := range []string{
		`{"name":"a\u0000b","model":"m"}`,
		`{"name":"ab","model":"m","metadata":{"k":"\u0000"}}`,
		`{"name":"ab","model":"m","tools":[{"type":"custom","name":"x","description":"d","input_schema":{"properties":{"a\u0000":{}}}}]}`,
	} {
		if msg := a.fail(400, "POST", "/v1/agents", b); !strings.Contains(msg, "NUL") {
			t.Fatalf("%s: %q", b, msg)
		}
	}
	a.fail(400, "POST", "/v1/environments", `{"name":"e\u0000"}`)
	// An escaped backslash followed by u0000 is ordinary text.
	if ag := a.ok("POST", "/v1/agents", `{"name":"a\\u0000","model":"m"}`); ag["name"] != `a\u0000` {
		t.Fatalf("name = %q", ag["name"])
	}
}

// Concurrent updates naming the same version: exactly one makes version 2.
func TestAgentUpdateRace(t *testing.T) {
	a := setup(t, nil)
	id := a.ok("POST", "/v1/agents", map[string]any{"name": "a", "model": "m"})["id"].(string)
	const n = 8
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses <- a.do("POST", "/v1/agents/"+id, map[string]any{"version": 1, "system": fmt.Sprint("writer ", i)}).status
		})
	}
	wg.Wait()
	close(statuses)
	won, lost := 0, 0
	for s := range statuses {
		switch s {
		case http.StatusOK:
			won++
		case http.StatusConflict:
			lost++
		default:
			t.Errorf("status %d", s)
		}
	}
	if won != 1 || lost != n-1 {
		t.Fatalf("%d updates won, %d lost; want 1 and %d", won, lost, n-1)
	}
	if v := a.ok("GET", "/v1/agents/"+id, nil)["version"]; v != 2.0 {
		t.Fatalf("version %v after the race", v)
	}
}
