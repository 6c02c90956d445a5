package server_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/test/mcpserver"
)

// TestMCPToolsetAsksThenCalls runs an MCP toolset through a node, with the
// permission policy MCP tools default to: the session's first turn
// discovers the server's tools, its call of one asks (the session idles
// with requires_action naming the call, and the server is not called),
// the tenant's confirmation lets it run, and the result reaches the model.
// A denied call is answered without reaching the server.
func TestMCPToolsetAsksThenCalls(t *testing.T) {
	mcpSrv := mcpserver.New()
	hs := httptest.NewServer(mcpSrv)
	defer hs.Close()
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", MCPAllowPrivateNetworks: true})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	agent := postJSON(t, c, base+"/v1/agents", map[string]any{
		"name": "calc", "model": "fake",
		"mcp_servers": []any{map[string]any{"type": "url", "name": "calc", "url": hs.URL + "/mcp"}},
		"tools":       []any{map[string]any{"type": "mcp_toolset", "mcp_server_name": "calc"}},
	})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})
	sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})
	sid := sess["id"].(string)
	stream, err := c.Get(base + "/v1/sessions/" + sid + "/events/stream?beta=true")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	frames := sseFrames(stream.Body)
	next := func(want string) sseFrame {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					t.Fatalf("the stream ended before %s", want)
				}
				if f.event == "session.error" {
					t.Fatalf("waiting for %s: %v", want, f.data)
				}
				if f.event == want {
					return f
				}
			case <-deadline:
				t.Fatalf("no %s in a minute", want)
			}
		}
	}
	ask := func() string {
		t.Helper()
		postJSON(t, c, base+"/v1/sessions/"+sid+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "!tool add {\"a\":2,\"b\":3}\n!echo"}}},
		}})
		use := next("agent.mcp_tool_use")
		if use.data["name"] != "add" || use.data["mcp_server_name"] != "calc" || use.data["evaluated_permission"] != "ask" {
			t.Fatalf("the call: %v", use.data)
		}
		idle := next("session.status_idle")
		reason, _ := idle.data["stop_reason"].(map[string]any)
		ids, _ := reason["event_ids"].([]any)
		if reason["type"] != "requires_action" || len(ids) != 1 || ids[0] != use.data["id"] {
			t.Fatalf("idle after the call: %v (the call %v)", idle.data, use.data["id"])
		}
		return use.data["id"].(string)
	}
	confirm := func(id, result string) {
		postJSON(t, c, base+"/v1/sessions/"+sid+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.tool_confirmation", "tool_use_id": id, "result": result},
		}})
	}

	id := ask()
	if mcpSrv.Calls("add") != 0 {
		t.Fatal("the server was called before the confirmation")
	}
	confirm(id, "allow")
	res := next("agent.mcp_tool_result")
	if res.data["mcp_tool_use_id"] != id || res.data["is_error"] == true || textOf(res.data["content"]) != "5" {
		t.Fatalf("the result: %v", res.data)
	}
	if msg := next("agent.message"); textOf(msg.data["content"]) != "results: 5" {
		t.Fatalf("the model was given %v", msg.data)
	}
	next("session.status_idle")
	if mcpSrv.Calls("add") != 1 {
		t.Fatalf("add called %d times, want 1", mcpSrv.Calls("add"))
	}

	// Denied: answered here, never sent to the server.
	id = ask()
	confirm(id, "deny")
	res = next("agent.mcp_tool_result")
	if res.data["mcp_tool_use_id"] != id || res.data["is_error"] != true {
		t.Fatalf("the denied call's result: %v", res.data)
	}
	next("session.status_idle")
	if mcpSrv.Calls("add") != 1 {
		t.Fatalf("a denied call reached the server: add called %d times", mcpSrv.Calls("add"))
	}
}

// textOf joins the text blocks of an event's content.
func textOf(content any) string {
	blocks, _ := content.([]any)
	s := ""
	for _, b := range blocks {
		if m, ok := b.(map[string]any); ok && m["type"] == "text" {
			s += m["text"].(string)
		}
	}
	return s
}
