package publicapi

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"corral.dev/corral/internal/errdefs"
)

// The resolved form of an agent: what corral stores and returns. Requests
// are decoded field by field (so that an omitted field, null and a value
// differ) and applied to a base: empty defaults on create, the latest
// version on update, the agent version for session overrides.

// agentCore is what a session's agent snapshot and an agent version share.
type agentCore struct {
	Description       string            `json:"description"`
	System            string            `json:"system"`
	Model             modelConfig       `json:"model"`
	Tools             []tool            `json:"tools"`
	MCPServers        []mcpServer       `json:"mcp_servers"`
	Skills            []skill           `json:"skills"`
	Multiagent        *struct{}         `json:"multiagent"` // always null: not supported yet
	ExecutionIdentity executionIdentity `json:"execution_identity"`
}

// agentSpec is an agent version's stored body (its name is a column).
type agentSpec struct {
	agentCore
	Metadata map[string]string `json:"metadata"`
}

type modelConfig struct {
	ID           string      `json:"id"`
	Effort       typedString `json:"effort"`
	Speed        string      `json:"speed"`
	InferenceGeo string      `json:"inference_geo,omitempty"`
}

// typedString is {"type": "..."}: effort levels and permission policies.
type typedString struct {
	Type string `json:"type"`
}

type executionIdentity struct {
	Type    string `json:"type"`
	RoleARN string `json:"role_arn,omitempty"`
}

type mcpServer struct {
	Type string `json:"type"`
	Name string `json:"name"`
	URL  string `json:"url"`
}

type skill struct {
	Type    string `json:"type"`
	SkillID string `json:"skill_id"`
	Version string `json:"version"`
}

// tool is one entry of an agent's tools, in resolved form. Toolsets carry
// default_config and configs (every built-in tool for the agent toolset);
// custom tools carry name, description and input_schema.
type tool struct {
	Type          string          `json:"type"`
	MCPServerName string          `json:"mcp_server_name,omitempty"`
	DefaultConfig *toolDefault    `json:"default_config,omitempty"`
	Configs       *[]toolConfig   `json:"configs,omitempty"`
	Name          string          `json:"name,omitempty"`
	Description   *string         `json:"description,omitempty"`
	InputSchema   json.RawMessage `json:"input_schema,omitempty"`
}

type toolDefault struct {
	Enabled          bool        `json:"enabled"`
	PermissionPolicy typedString `json:"permission_policy"`
}

// toolConfig is one tool's resolved config. Options holds the web_fetch and
// web_search options (null when unset), checked (tools.go).
type toolConfig struct {
	Name             string                     `json:"name"`
	Type             string                     `json:"type,omitempty"`
	Enabled          bool                       `json:"enabled"`
	PermissionPolicy typedString                `json:"permission_policy"`
	Options          map[string]json.RawMessage `json:"-"`
}

func (c toolConfig) MarshalJSON() ([]byte, error) {
	type plain toolConfig
	b, err := json.Marshal(plain(c))
	if err != nil || len(c.Options) == 0 {
		return b, err
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range c.Options {
		m[k] = v
	}
	return json.Marshal(m)
}

func (c *toolConfig) UnmarshalJSON(b []byte) error {
	type plain toolConfig
	if err := json.Unmarshal(b, (*plain)(c)); err != nil {
		return err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for _, k := range []string{"name", "type", "enabled", "permission_policy"} {
		delete(m, k)
	}
	if len(m) > 0 {
		c.Options = m
	}
	return nil
}

// Built-in tools, in the order configs are returned.
var builtinTools = []string{"bash", "edit", "read", "write", "glob", "grep", "web_fetch", "web_search"}

const (
	agentToolset = "agent_toolset_20260401"
	mcpToolset   = "mcp_toolset"
	customTool   = "custom"

	maxAgentName        = 256
	maxAgentDescription = 2048
	maxSystem           = 100_000
	maxTools            = 256
	maxMCPServers       = 20
	maxSkills           = 20
)

var (
	permissionPolicies = []string{"always_allow", "always_ask", "auto"}
	effortLevels       = []string{"low", "medium", "high", "xhigh", "max"}
	speeds             = []string{"standard", "fast"}
)

// agentFields are the members of an agent request, raw: nil when absent.
type agentFields struct {
	Name              json.RawMessage `json:"name"`
	Description       json.RawMessage `json:"description"`
	System            json.RawMessage `json:"system"`
	Model             json.RawMessage `json:"model"`
	Tools             json.RawMessage `json:"tools"`
	MCPServers        json.RawMessage `json:"mcp_servers"`
	Skills            json.RawMessage `json:"skills"`
	Multiagent        json.RawMessage `json:"multiagent"`
	Metadata          json.RawMessage `json:"metadata"`
	ExecutionIdentity json.RawMessage `json:"execution_identity"`
}

func defaultCore() agentCore {
	return agentCore{
		Tools: []tool{}, MCPServers: []mcpServer{}, Skills: []skill{},
		ExecutionIdentity: executionIdentity{Type: "service_account"},
	}
}

// applyCore applies the fields of f that belong to agentCore to c. Tools,
// MCP servers and skills are full replacements; null or [] clears them;
// description and system clear with null or "". The model cannot be
// cleared. Run validateCore on the result.
func applyCore(c *agentCore, f agentFields) error {
	if present(f.Description) {
		c.Description = ""
		if !isNull(f.Description) {
			if err := field(f.Description, "description", &c.Description); err != nil {
				return err
			}
			if err := checkLen(c.Description, "description", 0, maxAgentDescription); err != nil {
				return err
			}
		}
	}
	if present(f.System) {
		c.System = ""
		if !isNull(f.System) {
			if err := field(f.System, "system", &c.System); err != nil {
				return err
			}
			if err := checkLen(c.System, "system", 0, maxSystem); err != nil {
				return err
			}
		}
	}
	if present(f.Model) {
		m, err := decodeModel(f.Model)
		if err != nil {
			return err
		}
		c.Model = m
	}
	if present(f.MCPServers) {
		s, err := decodeMCPServers(f.MCPServers)
		if err != nil {
			return err
		}
		c.MCPServers = s
	}
	if present(f.Tools) {
		t, err := decodeTools(f.Tools)
		if err != nil {
			return err
		}
		c.Tools = t
	}
	if present(f.Skills) {
		sk, err := decodeSkills(f.Skills)
		if err != nil {
			return err
		}
		c.Skills = sk
	}
	if present(f.Multiagent) && !isNull(f.Multiagent) {
		return refuse("agent.multiagent", "multiagent")
	}
	if present(f.ExecutionIdentity) {
		c.ExecutionIdentity = executionIdentity{Type: "service_account"}
		if !isNull(f.ExecutionIdentity) {
			var e executionIdentity
			if err := field(f.ExecutionIdentity, "execution_identity", &e); err != nil {
				return err
			}
			switch e.Type {
			case "service_account":
				if e.RoleARN != "" {
					return errdefs.InvalidArgument("execution_identity.role_arn is only allowed with type aws_role")
				}
			case "aws_role":
				return refuse("agent.execution_identity", "execution_identity")
			default:
				return enumError("execution_identity.type", e.Type, []string{"service_account", "aws_role"})
			}
		}
	}
	return nil
}

// neutralize sets every refused field of c to its neutral value and reports
// whether anything changed. Agent versions and session snapshots stored
// before those fields were refused may hold other values; none of them was
// ever in force (nothing that runs a session reads them), so they are
// reported, and carried into new versions, as what the session really got.
func neutralize(c *agentCore) bool {
	// Only custom skills resolved to a version were ever in force
	// (skills.go); anything else stored before is dropped.
	changed := false
	kept := []skill{}
	for _, sk := range c.Skills {
		if sk.Type == "custom" && sk.Version != "" {
			kept = append(kept, sk)
		} else {
			changed = true
		}
	}
	c.Skills = kept
	if c.Model.Effort.Type != "high" || c.Model.Speed != "standard" || c.Model.InferenceGeo != "" {
		changed = true
		c.Model.Effort, c.Model.Speed, c.Model.InferenceGeo = typedString{Type: "high"}, "standard", ""
	}
	if c.ExecutionIdentity != (executionIdentity{Type: "service_account"}) {
		changed = true
		c.ExecutionIdentity = executionIdentity{Type: "service_account"}
	}
	if c.Multiagent != nil {
		changed = true
		c.Multiagent = nil
	}
	for _, t := range c.Tools {
		if t.Type != agentToolset || t.Configs == nil {
			continue
		}
		for i := range *t.Configs {
			cfg := &(*t.Configs)[i]
			if cfg.Name != "web_fetch" && cfg.Name != "web_search" {
				continue
			}
			// Of the web tools' options only a url_sources other than
			// every source is refused; stored before it was, it never
			// applied.
			if v, ok := cfg.Options["url_sources"]; ok && !isNull(v) {
				if us, err := decodeURLSources(v, "url_sources"); err != nil || string(us) != allURLSources {
					changed = true
					cfg.Options["url_sources"] = json.RawMessage("null")
				}
			}
			cfg.Options = withNullOptions(cfg.Name, cfg.Options)
		}
	}
	return changed
}

// validateCore checks the rules that span fields.
func validateCore(c agentCore) error {
	if c.Model.ID == "" {
		return errdefs.InvalidArgument("model is required")
	}
	servers := map[string]bool{}
	for _, s := range c.MCPServers {
		servers[s.Name] = false
	}
	count := 0
	for i, t := range c.Tools {
		switch t.Type {
		case agentToolset:
			count += len(builtinTools)
		case mcpToolset:
			count += max(1, len(*t.Configs))
			used, ok := servers[t.MCPServerName]
			if !ok {
				return errdefs.InvalidArgument("tools[%d].mcp_server_name: no MCP server named %q in mcp_servers", i, t.MCPServerName)
			}
			if used {
				return errdefs.InvalidArgument("tools[%d]: MCP server %q already has an mcp_toolset", i, t.MCPServerName)
			}
			servers[t.MCPServerName] = true
		default:
			count++
		}
	}
	if count > maxTools {
		return errdefs.InvalidArgument("tools: %d tools across all toolsets; at most %d are allowed", count, maxTools)
	}
	for _, s := range c.MCPServers {
		if !servers[s.Name] {
			return errdefs.InvalidArgument("mcp_servers: server %q is not referenced by any mcp_toolset in tools", s.Name)
		}
	}
	return nil
}

func enumError(path, got string, allowed []string) error {
	return errdefs.InvalidArgument("%s: %q is not one of %s", path, got, strings.Join(allowed, ", "))
}

// decodeModel accepts a model id string or {id, effort?, speed?, inference_geo?};
// effort is a level string or {type: level}. Effort, speed and inference_geo
// are refused but at their neutral values (unsupported.go): the model runs at
// its default effort (high) and standard speed wherever its provider puts it.
func decodeModel(raw json.RawMessage) (modelConfig, error) {
	if isNull(raw) {
		return modelConfig{}, errdefs.InvalidArgument("model cannot be null: every agent needs a model")
	}
	m := modelConfig{Effort: typedString{Type: "high"}, Speed: "standard"}
	if jsonKind(raw) == "a string" {
		if err := field(raw, "model", &m.ID); err != nil {
			return m, err
		}
	} else {
		var in struct {
			ID           *string         `json:"id"`
			Effort       json.RawMessage `json:"effort"`
			Speed        *string         `json:"speed"`
			InferenceGeo *string         `json:"inference_geo"`
		}
		if jsonKind(raw) != "an object" {
			return m, errdefs.InvalidArgument("model: expected a model id string or an object, got %s", jsonKind(raw))
		}
		if err := field(raw, "model", &in); err != nil {
			return m, err
		}
		if in.ID == nil {
			return m, errdefs.InvalidArgument("model.id is required")
		}
		m.ID = *in.ID
		if present(in.Effort) && !isNull(in.Effort) {
			var level string
			if jsonKind(in.Effort) == "a string" {
				_ = json.Unmarshal(in.Effort, &level)
			} else {
				var e typedString
				if err := field(in.Effort, "model.effort", &e); err != nil {
					return m, err
				}
				level = e.Type
			}
			if !slices.Contains(effortLevels, level) {
				return m, enumError("model.effort", level, effortLevels)
			}
			if level != m.Effort.Type {
				return m, refuse("agent.model.effort", "model.effort")
			}
		}
		if in.Speed != nil {
			if !slices.Contains(speeds, *in.Speed) {
				return m, enumError("model.speed", *in.Speed, speeds)
			}
			if *in.Speed != m.Speed {
				return m, refuse("agent.model.speed", "model.speed")
			}
		}
		if in.InferenceGeo != nil && *in.InferenceGeo != "" {
			return m, refuse("agent.model.inference_geo", "model.inference_geo")
		}
	}
	if err := checkLen(m.ID, "model.id", 1, 256); err != nil {
		return m, err
	}
	return m, nil
}

// rawList decodes a JSON array (null is empty) of raw members.
func rawList(raw json.RawMessage, path string, limit int) ([]json.RawMessage, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := field(raw, path, &items); err != nil {
		return nil, err
	}
	if len(items) > limit {
		return nil, errdefs.InvalidArgument("%s has %d entries; at most %d are allowed", path, len(items), limit)
	}
	for i, it := range items {
		if k := jsonKind(it); k != "an object" {
			return nil, errdefs.InvalidArgument("%s[%d]: expected an object, got %s", path, i, k)
		}
	}
	return items, nil
}

func decodeMCPServers(raw json.RawMessage) ([]mcpServer, error) {
	items, err := rawList(raw, "mcp_servers", maxMCPServers)
	if err != nil {
		return nil, err
	}
	out := []mcpServer{}
	seen := map[string]bool{}
	for i, it := range items {
		path := fmt.Sprintf("mcp_servers[%d]", i)
		var s struct {
			Type *string `json:"type"`
			Name *string `json:"name"`
			URL  *string `json:"url"`
		}
		if err := field(it, path, &s); err != nil {
			return nil, err
		}
		if s.Type != nil && *s.Type != "url" {
			return nil, enumError(path+".type", *s.Type, []string{"url"})
		}
		if s.Name == nil {
			return nil, errdefs.InvalidArgument("%s.name is required", path)
		}
		if err := checkLen(*s.Name, path+".name", 1, 255); err != nil {
			return nil, err
		}
		if seen[*s.Name] {
			return nil, errdefs.InvalidArgument("%s.name: %q is used by another server; names must be unique", path, *s.Name)
		}
		seen[*s.Name] = true
		if s.URL == nil {
			return nil, errdefs.InvalidArgument("%s.url is required", path)
		}
		u, err := url.Parse(*s.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(*s.URL) > 2048 {
			return nil, errdefs.InvalidArgument("%s.url: %q is not an http or https URL", path, truncate(*s.URL))
		}
		out = append(out, mcpServer{Type: "url", Name: *s.Name, URL: *s.URL})
	}
	return out, nil
}
