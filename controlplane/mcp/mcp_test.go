package mcp_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/mcp"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/test/mcpserver"
)

// setup serves the in-repo MCP server and returns it, its agentloop
// definition and a client.
func setup(t *testing.T) (*mcpserver.Server, agentloop.MCPServer, *mcp.Client) {
	t.Helper()
	s := mcpserver.New()
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, agentloop.MCPServer{Type: "url", Name: "calc", URL: hs.URL}, &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true}
}

// unreachable is the URL of a port nothing listens on.
func unreachable(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr + "/mcp"
}

func TestListTools(t *testing.T) {
	_, srv, c := setup(t)
	tools, err := c.ListTools(context.Background(), "sesn_test", srv)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]agentloop.MCPTool{}
	for _, tl := range tools {
		byName[tl.Name] = tl
	}
	if len(tools) != 3 || byName["add"].Description != "Add two integers." || byName["fail"].Name != "fail" {
		t.Fatalf("tools %+v", tools)
	}
	var schema struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(byName["add"].InputSchema, &schema); err != nil || schema.Type != "object" || schema.Properties["a"] == nil || schema.Properties["b"] == nil {
		t.Fatalf("add's schema %s: %v", byName["add"].InputSchema, err)
	}
}

func TestCallTool(t *testing.T) {
	s, srv, c := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, tool, input string
		wantErr           bool
		want              string
	}{
		{"result", "add", `{"a":40,"b":2}`, false, "42"},
		{"no input", "echo", ``, true, `missing properties: ["text"]`},
		{"tool error", "fail", `{}`, true, "the fail tool always fails"},
		{"bad arguments", "add", `{"a":"forty"}`, true, "a"},
		{"unknown tool", "nope", `{}`, true, "nope"},
	} {
		res, err := c.CallTool(ctx, "sesn_test", srv, tc.tool, []byte(tc.input))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res.IsError != tc.wantErr || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, tc.want) {
			t.Errorf("%s: %+v, want is_error %v and %q", tc.name, res, tc.wantErr, tc.want)
		}
	}
	if n := s.Calls("add"); n != 1 {
		t.Errorf("add served %d calls, want 1 (bad arguments never reach the handler)", n)
	}
}

func TestUnreachableServer(t *testing.T) {
	c := &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true}
	srv := agentloop.MCPServer{Type: "url", Name: "gone", URL: unreachable(t)}
	start := time.Now()
	if _, err := c.ListTools(context.Background(), "sesn_test", srv); err == nil || !strings.Contains(err.Error(), "connecting to") {
		t.Fatalf("ListTools: %v", err)
	}
	if _, err := c.CallTool(context.Background(), "sesn_test", srv, "add", []byte(`{}`)); err == nil {
		t.Fatal("CallTool on an unreachable server succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("failing took %s; an unreachable server must fail fast", d)
	}
	if _, err := c.ListTools(context.Background(), "sesn_test", agentloop.MCPServer{Type: "stdio", Name: "x", URL: "x"}); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("stdio server: %v", err)
	}
}

// TestLoopWithMCPServer runs the agent loop against the in-repo server:
// discovery when the turn starts, always_ask by default, a call, a tool
// error, and the events as the official SDK decodes them.
func TestLoopWithMCPServer(t *testing.T) {
	s, srv, c := setup(t)
	st := looptest.NewMemStore()
	var agent agentloop.Agent
	agent.Model.ID = "fake"
	agent.MCPServers = []agentloop.MCPServer{srv}
	agent.Tools = []agentloop.ToolSpec{{Type: agentloop.MCPToolset, MCPServerName: "calc", Configs: []agentloop.ToolConfig{
		{Name: "add", PermissionPolicy: &agentloop.Policy{Type: "always_allow"}},
		{Name: "fail", PermissionPolicy: &agentloop.Policy{Type: "always_allow"}},
	}}}
	st.CreateSession("sesn_1", agent)
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, MCP: c, NewID: looptest.NewID}
	say := func(text string) {
		b, _ := json.Marshal(map[string]any{"id": looptest.NewID(), "type": "user.message", "content": []map[string]string{{"type": "text", "text": text}}})
		if err := st.AddUserEvent("sesn_1", b); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Run(ctx, "sesn_1"); err != nil {
			t.Fatal(err)
		}
	}
	say("!tools add {\"a\":20,\"b\":22}; fail {}; echo {\"text\":\"hi\"}\n!echo")

	var uses, results []anthropic.BetaManagedAgentsSessionEventUnion
	for _, raw := range st.RawEvents("sesn_1") {
		var e anthropic.BetaManagedAgentsSessionEventUnion
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("the SDK cannot decode %s: %v", raw, err)
		}
		switch e.Type {
		case "agent.mcp_tool_use":
			uses = append(uses, e)
		case "agent.mcp_tool_result":
			results = append(results, e)
		}
	}
	if len(uses) != 3 {
		t.Fatalf("%d mcp tool uses, want 3", len(uses))
	}
	add, fail, echo := uses[0].AsAgentMCPToolUse(), uses[1].AsAgentMCPToolUse(), uses[2].AsAgentMCPToolUse()
	if add.Name != "add" || add.MCPServerName != "calc" || add.EvaluatedPermission != "allow" || add.Input["a"] != float64(20) {
		t.Fatalf("add use %+v", add)
	}
	if echo.Name != "echo" || echo.EvaluatedPermission != "ask" {
		t.Fatalf("echo use %+v, want ask (the MCP default)", echo)
	}
	// echo waits for confirmation; add and fail wait with it.
	if len(results) != 0 || s.Calls("add") != 0 {
		t.Fatalf("tools ran before the confirmation: %d results, %d add calls", len(results), s.Calls("add"))
	}
	b, _ := json.Marshal(map[string]any{"id": looptest.NewID(), "type": "user.tool_confirmation", "tool_use_id": echo.ID, "result": "allow"})
	if err := st.AddUserEvent("sesn_1", b); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx, "sesn_1"); err != nil {
		t.Fatal(err)
	}
	got := map[string]anthropic.BetaManagedAgentsAgentMCPToolResultEvent{}
	for _, raw := range st.RawEvents("sesn_1") {
		var e anthropic.BetaManagedAgentsSessionEventUnion
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		if e.Type == "agent.mcp_tool_result" {
			res := e.AsAgentMCPToolResult()
			got[res.MCPToolUseID] = res
		}
	}
	if r := got[add.ID]; r.IsError || len(r.Content) != 1 || r.Content[0].Text != "42" {
		t.Errorf("add result %+v", r)
	}
	if r := got[fail.ID]; !r.IsError || !strings.Contains(r.Content[0].Text, "always fails") {
		t.Errorf("fail result %+v", r)
	}
	if r := got[echo.ID]; r.IsError || r.Content[0].Text != "hi" {
		t.Errorf("echo result %+v", r)
	}
	if st.Status("sesn_1") != "idle" {
		t.Errorf("status %s", st.Status("sesn_1"))
	}
}

// TestLoopWithUnreachableServer: a clear session.error, and the session
// still answers.
func TestLoopWithUnreachableServer(t *testing.T) {
	st := looptest.NewMemStore()
	var agent agentloop.Agent
	agent.Model.ID = "fake"
	agent.MCPServers = []agentloop.MCPServer{{Type: "url", Name: "gone", URL: unreachable(t)}}
	agent.Tools = []agentloop.ToolSpec{{Type: agentloop.MCPToolset, MCPServerName: "gone"}}
	st.CreateSession("sesn_1", agent)
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, MCP: &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true}, NewID: looptest.NewID}
	b, _ := json.Marshal(map[string]any{"id": looptest.NewID(), "type": "user.message", "content": []map[string]string{{"type": "text", "text": "hello"}}})
	if err := st.AddUserEvent("sesn_1", b); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background(), "sesn_1"); err != nil {
		t.Fatal(err)
	}
	var sawError, sawReply bool
	for _, raw := range st.RawEvents("sesn_1") {
		var e anthropic.BetaManagedAgentsSessionEventUnion
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		switch e.Type {
		case "session.error":
			se := e.AsSessionError()
			mcpErr := se.Error.AsMCPConnectionFailedError()
			sawError = se.Error.Type == "mcp_connection_failed_error" && mcpErr.MCPServerName == "gone" && strings.Contains(mcpErr.Message, "gone")
		case "agent.message":
			sawReply = e.AsAgentMessage().Content[0].Text == "echo: hello"
		}
	}
	if !sawError || !sawReply || st.Status("sesn_1") != "idle" {
		t.Fatalf("error event %v, reply %v, status %s", sawError, sawReply, st.Status("sesn_1"))
	}
}
