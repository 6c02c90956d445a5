package agentloop_test

import (
	"encoding/json"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
)

// TestToolsForTheModel: what the model is offered for a toolset config.
func TestToolsForTheModel(t *testing.T) {
	allow := &agentloop.Policy{Type: "always_allow"}
	ask := &agentloop.Policy{Type: "always_ask"}
	off, on := false, true
	mcpTools := map[string][]agentloop.MCPTool{"docs": {{Name: "lookup", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "bash"}, {Name: "hidden"}}}
	for _, c := range []struct {
		name  string
		tools []agentloop.ToolSpec
		pins  map[string][]agentloop.MCPTool
		want  string
	}{
		{"full toolset", []agentloop.ToolSpec{{Type: agentloop.AgentToolset}},
			nil, "bash read write edit glob grep web_fetch(server) web_search(server)"},
		{"web tools disabled", []agentloop.ToolSpec{{Type: agentloop.AgentToolset, Configs: []agentloop.ToolConfig{{Name: "web_fetch", Enabled: &off}, {Name: "web_search", Enabled: &off}}}},
			nil, "bash read write edit glob grep"},
		{"only some", []agentloop.ToolSpec{{Type: agentloop.AgentToolset, DefaultConfig: &agentloop.ToolConfig{Enabled: &off}, Configs: []agentloop.ToolConfig{{Name: "bash", Enabled: &on}, {Name: "read", Enabled: &on}}}},
			nil, "bash read"},
		{"web tools need always_allow", []agentloop.ToolSpec{{Type: agentloop.AgentToolset, DefaultConfig: &agentloop.ToolConfig{PermissionPolicy: ask}, Configs: []agentloop.ToolConfig{{Name: "web_search", PermissionPolicy: allow}}}},
			nil, "bash read write edit glob grep web_search(server)"},
		{"mcp before discovery", []agentloop.ToolSpec{{Type: agentloop.MCPToolset, MCPServerName: "docs"}},
			nil, ""},
		{"mcp pinned, a disabled tool and a name taken", []agentloop.ToolSpec{{Type: agentloop.MCPToolset, MCPServerName: "docs", Configs: []agentloop.ToolConfig{{Name: "hidden", Enabled: &off}}}, {Type: agentloop.AgentToolset, DefaultConfig: &agentloop.ToolConfig{Enabled: &off}, Configs: []agentloop.ToolConfig{{Name: "bash", Enabled: &on}}}},
			mcpTools, "bash lookup"},
	} {
		var a agentloop.Agent
		a.Model.ID = "fake"
		a.Tools = c.tools
		a.MCPTools = c.pins
		log := []agentloop.Event{
			{ID: "e1", Type: agentloop.UserMessage, Processed: true, Content: []model.Block{{Type: "text", Text: "hi"}}},
			{ID: "e2", Type: agentloop.StatusRunning},
		}
		act, err := agentloop.Decide(a, log, agentloop.Config{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		cm, ok := act.(agentloop.CallModel)
		if !ok {
			t.Fatalf("%s: %T, want CallModel", c.name, act)
		}
		var got []string
		for _, tl := range cm.Request.Tools {
			n := tl.Name
			if tl.Server != "" {
				n += "(server)"
				if len(tl.InputSchema) != 0 {
					t.Errorf("%s: server tool %s has a schema", c.name, tl.Name)
				}
			}
			got = append(got, n)
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s: tools %v, want %s", c.name, got, c.want)
		}
	}
}
