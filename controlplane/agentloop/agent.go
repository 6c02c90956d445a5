package agentloop

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"corral.dev/corral/controlplane/model"
)

// Agent is the part of a session's resolved agent snapshot the loop uses.
type Agent struct {
	Model struct {
		ID string `json:"id"`
	} `json:"model"`
	System     string      `json:"system"`
	Tools      []ToolSpec  `json:"tools"`
	MCPServers []MCPServer `json:"mcp_servers"`
	// MCPTools are the tools pinned for this session, by MCP server name,
	// as the Store loads them. A server without an entry has not been
	// discovered yet; one with an empty list offers no tools.
	MCPTools map[string][]MCPTool `json:"-"`
	// SelfHosted, as the Store loads it, says that the session's
	// environment is self_hosted: a worker on the tenant's machine runs its
	// built-in tool calls and answers each with a user.tool_result; the
	// loop never runs them and never asks for a sandbox.
	SelfHosted bool `json:"-"`
	// Skills are the session's skills as the Store loads them (their
	// names and descriptions from each pinned version's SKILL.md); the
	// model is told of each, and where its files are (SkillsDir).
	Skills []Skill `json:"-"`
}

// SkillsDir is where a session's skills are in its sandbox, one directory
// per skill name (tools.Skills; the fleet stages them there, read-only,
// with the session's uploads). The Managed Agents docs name no path.
const SkillsDir = "/mnt/session/uploads/.skills"

// Skill is one skill offered to the model.
type Skill struct {
	Name        string
	Description string
}

// Path is the skill's SKILL.md in the sandbox.
func (s Skill) Path() string { return SkillsDir + "/" + s.Name + "/SKILL.md" }

// systemPrompt is the agent's system prompt and, when it has skills, a
// list of them: each one's name, description and SKILL.md path, so that
// the model reads a skill's instructions when a task calls for it (the
// files are read-only). Names are [a-z0-9-] and descriptions carry no
// angle brackets (the API checks both), so the tags cannot be broken.
func (a Agent) systemPrompt() string {
	if len(a.Skills) == 0 {
		return a.System
	}
	var b strings.Builder
	b.WriteString(a.System)
	if a.System != "" {
		b.WriteString("\n\n")
	}
	b.WriteString("You have skills: folders of instructions and files for particular tasks, read-only in your sandbox. " +
		"When a task matches a skill's description, read its SKILL.md first (with the bash or read tool) and follow it.\n<available_skills>\n")
	for _, s := range a.Skills {
		fmt.Fprintf(&b, "<skill>\n<name>%s</name>\n<description>%s</description>\n<location>%s</location>\n</skill>\n", s.Name, s.Description, s.Path())
	}
	b.WriteString("</available_skills>")
	return b.String()
}

// MCPServer is one entry of the agent's mcp_servers.
type MCPServer struct {
	Type string `json:"type"` // url
	Name string `json:"name"`
	URL  string `json:"url"`
}

// MCPTool is a tool an MCP server offered when the session discovered it.
type MCPTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
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

// ToolConfig enables a tool and sets its permission policy, and a web
// tool's options (checked by the API when the agent was stored).
type ToolConfig struct {
	Name             string              `json:"name,omitempty"`
	Enabled          *bool               `json:"enabled,omitempty"`
	PermissionPolicy *Policy             `json:"permission_policy,omitempty"`
	AllowedDomains   []string            `json:"allowed_domains,omitempty"`
	BlockedDomains   []string            `json:"blocked_domains,omitempty"`
	MaxContentTokens int64               `json:"max_content_tokens,omitempty"`
	UserLocation     *model.UserLocation `json:"user_location,omitempty"`
}

// webOptions is the toolset's options for web tool name (nil: none).
func (spec ToolSpec) webOptions(name string) *model.WebOptions {
	for _, c := range spec.Configs {
		if c.Name != name {
			continue
		}
		if len(c.AllowedDomains) == 0 && len(c.BlockedDomains) == 0 && c.MaxContentTokens == 0 && c.UserLocation == nil {
			return nil
		}
		return &model.WebOptions{AllowedDomains: c.AllowedDomains, BlockedDomains: c.BlockedDomains, MaxContentTokens: c.MaxContentTokens, UserLocation: c.UserLocation}
	}
	return nil
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

// ExecLimits bound the bash tool's commands: the session's runtime profile
// (policy/runtimes.yaml) sets them, the tools apply them, the host's driver
// kills a command at its timeout, and the model is told them in the bash
// tool's description. Zero fields take DefaultExecLimits'.
type ExecLimits struct {
	// DefaultTimeout applies to a command without timeout_ms; MaxTimeout
	// is the greatest timeout_ms.
	DefaultTimeout, MaxTimeout time.Duration
	// MaxOutputBytes is the output kept per stream (head and tail).
	MaxOutputBytes int
}

// DefaultExecLimits are the shipped gvisor profile's.
var DefaultExecLimits = ExecLimits{DefaultTimeout: 2 * time.Minute, MaxTimeout: 10 * time.Minute, MaxOutputBytes: 30000}

// WithDefaults fills l's zero fields from DefaultExecLimits, and keeps the
// default timeout within the greatest.
func (l ExecLimits) WithDefaults() ExecLimits {
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = DefaultExecLimits.MaxTimeout
	}
	if l.DefaultTimeout <= 0 {
		l.DefaultTimeout = DefaultExecLimits.DefaultTimeout
	}
	l.DefaultTimeout = min(l.DefaultTimeout, l.MaxTimeout)
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultExecLimits.MaxOutputBytes
	}
	return l
}

// BashTool is the bash tool as the model sees it under limits: its
// description and schema state the real numbers.
func BashTool(l ExecLimits) model.Tool {
	l = l.WithDefaults()
	return model.Tool{Name: "bash",
		Description: fmt.Sprintf("Run a bash command in the session's sandbox. Each command runs in a fresh shell that starts in the directory where the previous command ended (the workspace, /workspace, at first); environment variables do not carry over. restart: true resets the directory. Output is cut in the middle past %d bytes per stream. The command is killed after timeout_ms (default %d, at most %d), with exit code 124.",
			l.MaxOutputBytes, l.DefaultTimeout.Milliseconds(), l.MaxTimeout.Milliseconds()),
		InputSchema: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"command":{"type":"string","description":"The command to run."},"restart":{"type":"boolean","description":"Start over in the workspace directory."},"timeout_ms":{"type":"integer","minimum":1,"maximum":%d,"description":"Kill the command after this many milliseconds."}},"additionalProperties":false}`, l.MaxTimeout.Milliseconds()))}
}

// BuiltinToolsFor are the sandbox tools of agent_toolset_20260401 with
// their input schemas, as the model sees them under limits.
// controlplane/tools runs them and decodes their inputs against these
// schemas.
func BuiltinToolsFor(l ExecLimits) []model.Tool {
	out := slices.Clone(BuiltinTools)
	out[0] = BashTool(l)
	return out
}

// BuiltinTools are the sandbox tools under DefaultExecLimits (bash first).
var BuiltinTools = []model.Tool{
	BashTool(DefaultExecLimits),
	{Name: "read", Description: "Read a text file in the workspace. Lines are numbered cat -n style (the number, a tab, the line). Without view_range the first 2000 lines are shown; view_range [start, end] shows lines start..end (1-based, inclusive; end -1 reads to the end of the file).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string","description":"Absolute path under /workspace, or relative to it."},"view_range":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2,"description":"[start_line, end_line]; end_line -1 means the end of the file."}},"required":["file_path"],"additionalProperties":false}`)},
	{Name: "write", Description: "Create or replace a file in the workspace with the given content, creating parent directories.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string","description":"Absolute path under /workspace, or relative to it."},"content":{"type":"string"}},"required":["file_path","content"],"additionalProperties":false}`)},
	{Name: "edit", Description: "Replace text in a workspace file. old_string must match the file exactly (whitespace included) and, unless replace_all is true, exactly once.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string","description":"Absolute path under /workspace, or relative to it."},"old_string":{"type":"string","description":"The exact text to replace."},"new_string":{"type":"string","description":"The replacement."},"replace_all":{"type":"boolean","description":"Replace every occurrence."}},"required":["file_path","old_string","new_string"],"additionalProperties":false}`)},
	{Name: "glob", Description: "Find workspace files whose path matches a glob pattern (* and ? within a path segment, ** for any number of directories), newest first, at most 100.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"pattern":{"type":"string","description":"For example **/*.py."},"path":{"type":"string","description":"Directory to search from; the workspace by default."}},"required":["pattern"],"additionalProperties":false}`)},
	{Name: "grep", Description: "Search workspace files for a regular expression (RE2 syntax), line by line. output_mode files_with_matches (default) lists the files, content shows path:line:text, count shows matches per file.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"pattern":{"type":"string","description":"Regular expression."},"path":{"type":"string","description":"File or directory to search; the workspace by default."},"glob":{"type":"string","description":"Only files whose name matches, for example *.go."},"output_mode":{"type":"string","enum":["files_with_matches","content","count"]},"case_insensitive":{"type":"boolean"},"head_limit":{"type":"integer","minimum":1,"description":"At most this many output lines (default 250)."}},"required":["pattern"],"additionalProperties":false}`)},
}

// ServerTools are the toolset's tools the model's provider runs itself
// (declared natively to the anthropic model; other models ignore them).
// They cannot wait for a confirmation, so they are offered only under
// always_allow.
var ServerTools = []model.Tool{
	{Name: "web_fetch", Server: model.ServerWebFetch},
	{Name: "web_search", Server: model.ServerWebSearch},
}

// toolKind is how the loop treats a tool name.
type toolKind int

const (
	unknownTool toolKind = iota
	builtinTool
	customTool
	mcpTool
)

// toolTable is the agent's tools resolved: which names exist, of what kind,
// and with what policy.
type toolTable struct {
	kinds     map[string]toolKind
	ask       map[string]bool   // built-in and MCP tools under always_ask
	mcpServer map[string]string // MCP tool name -> its server's name
	forModel  []model.Tool
}

// config is a toolset's setting for one tool: its default_config, then its
// configs entry for name.
func (spec ToolSpec) config(name string, defEnabled, defAsk bool) (enabled, ask bool) {
	enabled, ask = defEnabled, defAsk
	if d := spec.DefaultConfig; d != nil {
		if d.Enabled != nil {
			enabled = *d.Enabled
		}
		if d.PermissionPolicy != nil {
			ask = asks(d.PermissionPolicy)
		}
	}
	for _, c := range spec.Configs {
		if c.Name != name {
			continue
		}
		if c.Enabled != nil {
			enabled = *c.Enabled
		}
		if c.PermissionPolicy != nil {
			ask = asks(c.PermissionPolicy)
		}
	}
	return enabled, ask
}

// resolveTools applies the toolset configs: enabled:false removes a tool,
// per-tool policies override the default, the agent toolset defaults to
// always_allow and MCP toolsets to always_ask. MCP tools come from the
// session's pins; one whose name another tool already has is left out.
func resolveTools(a Agent, limits ExecLimits) (toolTable, error) {
	builtins := BuiltinTools
	if limits != (ExecLimits{}) {
		builtins = BuiltinToolsFor(limits)
	}
	t := toolTable{kinds: map[string]toolKind{}, ask: map[string]bool{}, mcpServer: map[string]string{}}
	for _, spec := range a.Tools {
		switch spec.Type {
		case AgentToolset:
			for _, bt := range builtins {
				enabled, ask := spec.config(bt.Name, true, false)
				if !enabled {
					continue
				}
				t.kinds[bt.Name] = builtinTool
				t.ask[bt.Name] = ask
				t.forModel = append(t.forModel, bt)
			}
			for _, st := range ServerTools {
				if enabled, ask := spec.config(st.Name, true, false); enabled && !ask {
					st.Web = spec.webOptions(st.Name)
					t.forModel = append(t.forModel, st)
				}
			}
		case CustomTool:
			if spec.Name == "" {
				return t, fmt.Errorf("custom tool without a name")
			}
			t.kinds[spec.Name] = customTool
			t.forModel = append(t.forModel, model.Tool{Name: spec.Name, Description: spec.Description, InputSchema: spec.InputSchema})
		case MCPToolset:
			if spec.MCPServerName == "" {
				return t, fmt.Errorf("mcp_toolset without an mcp_server_name")
			}
		default:
			return t, fmt.Errorf("unknown tool type %q", spec.Type)
		}
	}
	for _, spec := range a.Tools {
		if spec.Type != MCPToolset {
			continue
		}
		for _, mt := range a.MCPTools[spec.MCPServerName] {
			enabled, ask := spec.config(mt.Name, true, true)
			if !enabled || t.kinds[mt.Name] != unknownTool {
				continue
			}
			t.kinds[mt.Name] = mcpTool
			t.ask[mt.Name] = ask
			t.mcpServer[mt.Name] = spec.MCPServerName
			t.forModel = append(t.forModel, model.Tool{Name: mt.Name, Description: mt.Description, InputSchema: mt.InputSchema})
		}
	}
	return t, nil
}

// NeedsSandbox reports whether the agent has a built-in sandbox tool
// enabled, so that its turns may need the session's sandbox.
func (a Agent) NeedsSandbox() bool {
	for _, spec := range a.Tools {
		if spec.Type != AgentToolset {
			continue
		}
		for _, bt := range BuiltinTools {
			if enabled, _ := spec.config(bt.Name, true, false); enabled {
				return true
			}
		}
	}
	return false
}

// UndiscoveredMCPServers returns the MCP servers the agent's toolsets use
// whose tools the session has not pinned yet, in toolset order. A toolset
// naming no server of mcp_servers comes back with only its name.
func UndiscoveredMCPServers(a Agent) []MCPServer {
	var out []MCPServer
	seen := map[string]bool{}
	for _, spec := range a.Tools {
		name := spec.MCPServerName
		if spec.Type != MCPToolset || seen[name] {
			continue
		}
		seen[name] = true
		if _, pinned := a.MCPTools[name]; pinned {
			continue
		}
		srv := MCPServer{Name: name}
		for _, s := range a.MCPServers {
			if s.Name == name {
				srv = s
			}
		}
		out = append(out, srv)
	}
	return out
}
