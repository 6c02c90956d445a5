package looptest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
)

// fakeMCP is an MCP port with one server whose tool list and reachability
// a scenario changes as it goes.
type fakeMCP struct {
	mu sync.Mutex
	// Fields below guarded by mu.
	tools     []agentloop.MCPTool
	down      bool
	listCalls int
}

func (f *fakeMCP) set(down bool, tools ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.tools = down, nil
	for _, n := range tools {
		f.tools = append(f.tools, agentloop.MCPTool{Name: n, Description: "the " + n + " tool", InputSchema: json.RawMessage(`{"type":"object"}`)})
	}
}

func (f *fakeMCP) lists() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listCalls
}

func (f *fakeMCP) ListTools(_ context.Context, _ string, srv agentloop.MCPServer) ([]agentloop.MCPTool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listCalls++
	if f.down {
		return nil, errors.New("connection refused")
	}
	return append([]agentloop.MCPTool(nil), f.tools...), nil
}

func (f *fakeMCP) CallTool(_ context.Context, _ string, srv agentloop.MCPServer, name string, input []byte) (agentloop.ToolResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return agentloop.ToolResult{}, errors.New("connection refused")
	}
	if name == "fail" {
		return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: "it failed"}}, IsError: true}, nil
	}
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: srv.Name + "/" + name + " got " + string(input)}}}, nil
}

func mcpAgent(configs ...agentloop.ToolConfig) agentloop.Agent {
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.MCPServers = []agentloop.MCPServer{{Type: "url", Name: "docs", URL: "http://docs.invalid/mcp"}}
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.MCPToolset, MCPServerName: "docs", Configs: configs}}
	return a
}

// runMCPSuite: MCP toolsets discovered and pinned when a turn starts,
// always_ask by default, results as agent.mcp_tool_result.
func runMCPSuite(t *testing.T, newHarness func(t *testing.T) Harness) {
	setup := func(t *testing.T, agent agentloop.Agent) (*scenario, *fakeMCP) {
		h := newHarness(t)
		mcp := &fakeMCP{}
		mcp.set(false, "lookup", "fail")
		return &scenario{
			h:  h,
			id: h.CreateSession(t, agent),
			runner: &agentloop.Loop{
				Store: h.Store(), Model: model.Fake{}, Tools: agentloop.NoSandbox{}, MCP: mcp, NewID: NewID,
				Backoff: func(int) time.Duration { return 0 },
			},
		}, mcp
	}

	t.Run("MCPAskThenAllow", func(t *testing.T) {
		s, mcp := setup(t, mcpAgent())
		s.say(t, "!tool lookup {\"q\":\"raft\"}\n!echo")
		log := s.run(t)
		expectTypes(t, log, 0, "user.message", "session.status_running", "span.model_request_start", "agent.mcp_tool_use", "span.model_request_end", "session.status_idle")
		use := log[3]
		var input map[string]string
		if use.Name != "lookup" || use.MCPServerName != "docs" || use.EvaluatedPermission != "ask" || json.Unmarshal(use.Input, &input) != nil || input["q"] != "raft" {
			t.Fatalf("mcp tool use %+v, want lookup on docs, ask", use)
		}
		if sr := log[5].StopReason; sr == nil || sr.Type != "requires_action" || len(sr.EventIDs) != 1 || sr.EventIDs[0] != use.ID {
			t.Fatalf("stop reason %+v", sr)
		}
		n := len(log)
		s.h.Send(t, s.id, map[string]any{"type": "user.tool_confirmation", "tool_use_id": use.ID, "result": "allow"})
		log = s.run(t)
		expectTypes(t, log, n, "user.tool_confirmation", "session.status_running", "agent.mcp_tool_result", "span.model_request_start", "agent.message", "span.model_request_end", "session.status_idle")
		res := log[n+2]
		if res.MCPToolUseID != use.ID || res.IsError || len(res.Content) != 1 || !strings.HasPrefix(res.Content[0].Text, "docs/lookup got {") || !strings.Contains(res.Content[0].Text, "raft") {
			t.Fatalf("mcp tool result %+v", res)
		}
		if txt := log[n+4].Content[0].Text; txt != "results: "+res.Content[0].Text {
			t.Errorf("the model saw %q", txt)
		}

		// The tools stay pinned: a second turn does not ask the server
		// again, and a tool it no longer lists is still offered.
		mcp.set(false, "other")
		n = len(log)
		s.say(t, "!tool lookup {}\n!echo")
		log = s.run(t)
		if got := mcp.lists(); got != 1 {
			t.Errorf("the server was asked for its tools %d times, want 1 (pinned)", got)
		}
		if use := last(log, "agent.mcp_tool_use"); use.Name != "lookup" || use.ID == log[3].ID {
			t.Fatalf("second turn: %v", types(log, n))
		}
		agent, _, err := s.h.Store().Load(context.Background(), s.id)
		if err != nil || len(agent.MCPTools["docs"]) != 2 || agent.MCPTools["docs"][0].Name != "lookup" || agent.MCPTools["docs"][0].Description != "the lookup tool" {
			t.Fatalf("pinned tools %+v, %v", agent.MCPTools, err)
		}
	})

	t.Run("MCPDenyAndToolError", func(t *testing.T) {
		allow := agentloop.ToolConfig{Name: "fail", PermissionPolicy: &agentloop.Policy{Type: "always_allow"}}
		s, _ := setup(t, mcpAgent(allow))
		s.say(t, "!tools lookup {}; fail {}\n!echo")
		log := s.run(t)
		uses := map[string]agentloop.Event{}
		for _, e := range log {
			if e.Type == "agent.mcp_tool_use" {
				uses[e.Name] = e
			}
		}
		if uses["lookup"].EvaluatedPermission != "ask" || uses["fail"].EvaluatedPermission != "allow" {
			t.Fatalf("permissions: lookup %q, fail %q", uses["lookup"].EvaluatedPermission, uses["fail"].EvaluatedPermission)
		}
		n := len(log)
		s.h.Send(t, s.id, map[string]any{"type": "user.tool_confirmation", "tool_use_id": uses["lookup"].ID, "result": "deny", "deny_message": "no lookups"})
		log = s.run(t)
		results := map[string]agentloop.Event{}
		for _, e := range log[n:] {
			if e.Type == "agent.mcp_tool_result" {
				results[e.MCPToolUseID] = e
			}
		}
		if r := results[uses["lookup"].ID]; !r.IsError || r.Content[0].Text != "no lookups" {
			t.Errorf("denied call: %+v", r)
		}
		if r := results[uses["fail"].ID]; !r.IsError || r.Content[0].Text != "it failed" {
			t.Errorf("failing tool: %+v", r)
		}
		if sr := last(log, "session.status_idle").StopReason; sr == nil || sr.Type != "end_turn" {
			t.Errorf("stop reason %+v", sr)
		}
	})

	t.Run("MCPServerUnreachable", func(t *testing.T) {
		s, mcp := setup(t, mcpAgent(agentloop.ToolConfig{Name: "lookup", PermissionPolicy: &agentloop.Policy{Type: "always_allow"}}))
		mcp.set(true)
		s.say(t, "hello")
		log := s.run(t)
		expectTypes(t, log, 0, "user.message", "session.status_running", "session.error", "span.model_request_start", "agent.message", "span.model_request_end", "session.status_idle")
		if e := errorBody(t, log[2]); e.Type != "mcp_connection_failed_error" || e.MCPServerName != "docs" || !strings.Contains(e.Message, "connection refused") || e.RetryStatus.Type != "exhausted" {
			t.Fatalf("error event %+v", e)
		}
		// The server comes back: the next turn discovers it and uses it;
		// then it goes away during a call, which is an error result.
		mcp.set(false, "lookup")
		n := len(log)
		s.say(t, "!tool lookup {}\n!echo")
		log = s.run(t)
		expectTypes(t, log, n, "user.message", "session.status_running", "span.model_request_start", "agent.mcp_tool_use", "span.model_request_end", "agent.mcp_tool_result", "span.model_request_start", "agent.message", "span.model_request_end", "session.status_idle")
		mcp.set(true)
		s.say(t, "!tool lookup {}\n!echo")
		log = s.run(t)
		if r := last(log, "agent.mcp_tool_result"); !r.IsError || !strings.Contains(r.Content[0].Text, "could not be reached") {
			t.Fatalf("call to a server that went away: %+v", r)
		}
		if sr := last(log, "session.status_idle").StopReason; sr == nil || sr.Type != "end_turn" {
			t.Errorf("stop reason %+v", sr)
		}
	})
}

type errorEventBody struct {
	Type          string `json:"type"`
	Message       string `json:"message"`
	MCPServerName string `json:"mcp_server_name"`
	RetryStatus   struct {
		Type string `json:"type"`
	} `json:"retry_status"`
}

func errorBody(t *testing.T, e agentloop.Event) errorEventBody {
	t.Helper()
	var out errorEventBody
	if err := json.Unmarshal(e.Error, &out); err != nil {
		t.Fatalf("session.error %s: %v", e.Error, err)
	}
	return out
}
