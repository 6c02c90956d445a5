package agentloop

import (
	"encoding/json"
	"fmt"

	"corral.dev/corral/controlplane/model"
)

// Agent is the part of a session's resolved agent snapshot the loop uses.
type Agent struct {
	Model struct {
		ID string `json:"id"`
	} `json:"model"`
	System string     `json:"system"`
	Tools  []ToolSpec `json:"tools"`
}

// ToolSpec is one entry of the agent's tools: a built-in toolset, an MCP
// toolset or a custom tool.
type ToolSpec struct {
	Type          string          `json:"type"`
	Name          string          `json:"name,omitempty"`
	Description   string          `json:"description,omitempty"`
	InputSchema   json.RawMessage `json:"input_schema,omitempty"`
	DefaultConfig *ToolConfig     `json:"default_config,omitempty"`
	Configs       []ToolConfig    `json:"configs,omitempty"`
	MCPServerName string          `json:"mcp_server_name,omitempty"`
}

// ToolConfig enables a tool and sets its permission policy.
type ToolConfig struct {
	Name             string  `json:"name,omitempty"`
	Enabled          *bool   `json:"enabled,omitempty"`
	PermissionPolicy *Policy `json:"permission_policy,omitempty"`
}

// Policy is a permission policy.
type Policy struct {
	Type string `json:"type"` // always_allow, always_ask
}

// asks reports whether a policy holds calls for the user's confirmation.
// Only always_allow runs without asking: "auto" (a server-evaluated policy
// this release does not evaluate) and anything unknown fail closed.
func asks(p *Policy) bool { return p.Type != "always_allow" }

// Toolset names.
const (
	AgentToolset = "agent_toolset_20260401"
	CustomTool   = "custom"
	MCPToolset   = "mcp_toolset"
)

// BuiltinTools are the tools of agent_toolset_20260401 with their input
// schemas, as the model sees them.
var BuiltinTools = []model.Tool{
	{Name: "bash", Description: "Run a shell command in the session's sandbox.", InputSchema: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"},"restart":{"type":"boolean"},"timeout_ms":{"type":"integer"}}}`)},
	{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string"},"view_range":{"type":"array","items":{"type":"integer"}}},"required":["file_path"]}`)},
	{Name: "write", Description: "Write a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string"},"content":{"type":"string"}},"required":["file_path","content"]}`)},
	{Name: "edit", Description: "Replace text in a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"},"replace_all":{"type":"boolean"}},"required":["file_path","old_string","new_string"]}`)},
	{Name: "glob", Description: "Find files by pattern.", InputSchema: json.RawMessage(`{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"}},"required":["pattern"]}`)},
	{Name: "grep", Description: "Search file contents.", InputSchema: json.RawMessage(`{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"}},"required":["pattern"]}`)},
	{Name: "web_fetch", Description: "Fetch a URL.", InputSchema: json.RawMessage(`{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]}`)},
	{Name: "web_search", Description: "Search the web.", InputSchema: json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}`)},
}

// toolKind is how the loop treats a tool name.
type toolKind int

const (
	unknownTool toolKind = iota
	builtinTool
	customTool
)

// toolTable is the agent's tools resolved: which names exist, of what kind,
// and with what policy.
type toolTable struct {
	kinds    map[string]toolKind
	ask      map[string]bool // built-ins under always_ask
	forModel []model.Tool
}

// resolveTools applies the toolset configs: enabled:false removes a tool,
// per-tool policies override the default, the agent toolset defaults to
// always_allow.
func resolveTools(a Agent) (toolTable, error) {
	t := toolTable{kinds: map[string]toolKind{}, ask: map[string]bool{}}
	for _, spec := range a.Tools {
		switch spec.Type {
		case AgentToolset:
			defEnabled, defAsk := true, false
			if d := spec.DefaultConfig; d != nil {
				if d.Enabled != nil {
					defEnabled = *d.Enabled
				}
				if d.PermissionPolicy != nil {
					defAsk = asks(d.PermissionPolicy)
				}
			}
			for _, bt := range BuiltinTools {
				enabled, ask := defEnabled, defAsk
				for _, c := range spec.Configs {
					if c.Name != bt.Name {
						continue
					}
					if c.Enabled != nil {
						enabled = *c.Enabled
					}
					if c.PermissionPolicy != nil {
						ask = asks(c.PermissionPolicy)
					}
				}
				if !enabled {
					continue
				}
				t.kinds[bt.Name] = builtinTool
				t.ask[bt.Name] = ask
				t.forModel = append(t.forModel, bt)
			}
		case CustomTool:
			if spec.Name == "" {
				return t, fmt.Errorf("custom tool without a name")
			}
			t.kinds[spec.Name] = customTool
			t.forModel = append(t.forModel, model.Tool{Name: spec.Name, Description: spec.Description, InputSchema: spec.InputSchema})
		case MCPToolset:
			// MCP toolsets are discovered per session in a later release;
			// until then their tools are not offered to the model.
		default:
			return t, fmt.Errorf("unknown tool type %q", spec.Type)
		}
	}
	return t, nil
}
