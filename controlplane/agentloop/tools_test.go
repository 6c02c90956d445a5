package agentloop_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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

// The bash tool the model sees states the limits the session's runtime
// profile sets, not fixed numbers.
func TestBashToolStatesItsLimits(t *testing.T) {
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	log := []agentloop.Event{
		{ID: "e1", Type: agentloop.UserMessage, Processed: true, Content: []model.Block{{Type: "text", Text: "hi"}}},
		{ID: "e2", Type: agentloop.StatusRunning},
	}
	for _, c := range []struct {
		limits agentloop.ExecLimits
		want   []string
	}{
		{agentloop.ExecLimits{}, []string{"past 30000 bytes", "default 120000, at most 600000", `"maximum":600000`}},
		{agentloop.ExecLimits{DefaultTimeout: 3 * time.Second, MaxTimeout: 3 * time.Second, MaxOutputBytes: 1024}, []string{"past 1024 bytes", "default 3000, at most 3000", `"maximum":3000`}},
		{agentloop.ExecLimits{DefaultTimeout: time.Hour, MaxTimeout: time.Minute}, []string{"default 60000, at most 60000"}},
	} {
		act, err := agentloop.Decide(a, log, agentloop.Config{Exec: c.limits})
		if err != nil {
			t.Fatal(err)
		}
		bash := act.(agentloop.CallModel).Request.Tools[0]
		if bash.Name != "bash" {
			t.Fatalf("first tool %s", bash.Name)
		}
		for _, w := range c.want {
			if !strings.Contains(bash.Description+string(bash.InputSchema), w) {
				t.Errorf("limits %+v: the bash tool does not say %q: %s %s", c.limits, w, bash.Description, bash.InputSchema)
			}
		}
	}
}
