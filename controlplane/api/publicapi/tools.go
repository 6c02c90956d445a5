package publicapi

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"corral.dev/corral/internal/errdefs"
)

var customToolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// decodeTools decodes an agent's tools into resolved form: toolsets get
// their defaults filled in (agent toolset: enabled, always_allow; MCP
// toolset: enabled, always_ask, so that tools a server adds later never run
// unapproved) and per-tool configs resolved against them.
func decodeTools(raw json.RawMessage) ([]tool, error) {
	items, err := rawList(raw, "tools", maxTools)
	if err != nil {
		return nil, err
	}
	out := []tool{}
	customNames := map[string]bool{}
	haveToolset := false
	for i, it := range items {
		path := fmt.Sprintf("tools[%d]", i)
		var head struct {
			Type *string `json:"type"`
		}
		_ = json.Unmarshal(it, &head)
		if head.Type == nil {
			return nil, errdefs.InvalidArgument("%s.type is required", path)
		}
		var t tool
		switch *head.Type {
		case agentToolset:
			if haveToolset {
				return nil, errdefs.InvalidArgument("%s: only one %s is allowed", path, agentToolset)
			}
			haveToolset = true
			t, err = decodeAgentToolset(it, path)
		case mcpToolset:
			t, err = decodeMCPToolset(it, path)
		case customTool:
			t, err = decodeCustomTool(it, path)
			if err == nil {
				if customNames[t.Name] {
					return nil, errdefs.InvalidArgument("%s.name: %q is used by another custom tool", path, t.Name)
				}
				customNames[t.Name] = true
			}
		default:
			return nil, enumError(path+".type", *head.Type, []string{agentToolset, mcpToolset, customTool})
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

type defaultConfigIn struct {
	Enabled          *bool           `json:"enabled"`
	PermissionPolicy json.RawMessage `json:"permission_policy"`
}

func decodePolicy(raw json.RawMessage, path string, def string) (typedString, error) {
	if !present(raw) || isNull(raw) {
		return typedString{Type: def}, nil
	}
	var p typedString
	if err := field(raw, path, &p); err != nil {
		return p, err
	}
	if !slices.Contains(permissionPolicies, p.Type) {
		return p, enumError(path+".type", p.Type, permissionPolicies)
	}
	return p, nil
}

func decodeDefault(raw json.RawMessage, path, policy string) (toolDefault, error) {
	d := toolDefault{Enabled: true, PermissionPolicy: typedString{Type: policy}}
	if !present(raw) || isNull(raw) {
		return d, nil
	}
	var in defaultConfigIn
	if err := field(raw, path, &in); err != nil {
		return d, err
	}
	if in.Enabled != nil {
		d.Enabled = *in.Enabled
	}
	p, err := decodePolicy(in.PermissionPolicy, path+".permission_policy", policy)
	if err != nil {
		return d, err
	}
	d.PermissionPolicy = p
	return d, nil
}

func decodeAgentToolset(raw json.RawMessage, path string) (tool, error) {
	var in struct {
		Type          string            `json:"type"`
		DefaultConfig json.RawMessage   `json:"default_config"`
		Configs       []json.RawMessage `json:"configs"`
	}
	if err := field(raw, path, &in); err != nil {
		return tool{}, err
	}
	def, err := decodeDefault(in.DefaultConfig, path+".default_config", "always_allow")
	if err != nil {
		return tool{}, err
	}
	given := map[string]toolConfig{}
	for j, c := range in.Configs {
		cpath := fmt.Sprintf("%s.configs[%d]", path, j)
		cfg, err := decodeBuiltinConfig(c, cpath, def)
		if err != nil {
			return tool{}, err
		}
		if _, dup := given[cfg.Name]; dup {
			return tool{}, errdefs.InvalidArgument("%s.name: %q is configured twice", cpath, cfg.Name)
		}
		given[cfg.Name] = cfg
	}
	configs := make([]toolConfig, 0, len(builtinTools))
	for _, name := range builtinTools {
		cfg, ok := given[name]
		if !ok {
			cfg = toolConfig{Name: name, Type: name, Enabled: def.Enabled, PermissionPolicy: def.PermissionPolicy}
		}
		if name == "web_fetch" || name == "web_search" {
			cfg.Options = withNullOptions(name, cfg.Options)
		}
		configs = append(configs, cfg)
	}
	return tool{Type: agentToolset, DefaultConfig: &def, Configs: &configs}, nil
}

// withNullOptions fills the web tools' unset options with null, as the API
// returns them.
func withNullOptions(name string, opts map[string]json.RawMessage) map[string]json.RawMessage {
	if opts == nil {
		opts = map[string]json.RawMessage{}
	}
	keys := []string{"allowed_domains", "blocked_domains", "user_location"}
	if name == "web_fetch" {
		keys = []string{"allowed_domains", "blocked_domains", "max_content_tokens", "url_sources"}
	}
	for _, k := range keys {
		if _, ok := opts[k]; !ok {
			opts[k] = json.RawMessage("null")
		}
	}
	return opts
}

func decodeBuiltinConfig(raw json.RawMessage, path string, def toolDefault) (toolConfig, error) {
	var in struct {
		Name             *string         `json:"name"`
		Type             *string         `json:"type"`
		Enabled          *bool           `json:"enabled"`
		PermissionPolicy json.RawMessage `json:"permission_policy"`
		AllowedDomains   json.RawMessage `json:"allowed_domains"`
		BlockedDomains   json.RawMessage `json:"blocked_domains"`
		MaxContentTokens json.RawMessage `json:"max_content_tokens"`
		URLSources       json.RawMessage `json:"url_sources"`
		UserLocation     json.RawMessage `json:"user_location"`
	}
	if err := field(raw, path, &in); err != nil {
		return toolConfig{}, err
	}
	var name string
	switch {
	case in.Name != nil:
		name = *in.Name
	case in.Type != nil:
		name = *in.Type
	default:
		return toolConfig{}, errdefs.InvalidArgument("%s.name is required", path)
	}
	if !slices.Contains(builtinTools, name) {
		return toolConfig{}, enumError(path+".name", name, builtinTools)
	}
	if in.Type != nil && *in.Type != name {
		return toolConfig{}, errdefs.InvalidArgument("%s.type: %q does not match name %q", path, *in.Type, name)
	}
	cfg := toolConfig{Name: name, Type: name, Enabled: def.Enabled}
	if in.Enabled != nil {
		cfg.Enabled = *in.Enabled
	}
	p, err := decodePolicy(in.PermissionPolicy, path+".permission_policy", def.PermissionPolicy.Type)
	if err != nil {
		return cfg, err
	}
	cfg.PermissionPolicy = p
	web := name == "web_fetch" || name == "web_search"
	options := []struct {
		key string
		raw json.RawMessage
	}{{"allowed_domains", in.AllowedDomains}, {"blocked_domains", in.BlockedDomains}, {"max_content_tokens", in.MaxContentTokens}, {"url_sources", in.URLSources}, {"user_location", in.UserLocation}}
	for _, o := range options {
		if !present(o.raw) || isNull(o.raw) {
			continue
		}
		ok := web && (o.key == "allowed_domains" || o.key == "blocked_domains" ||
			(name == "web_fetch" && (o.key == "max_content_tokens" || o.key == "url_sources")) ||
			(name == "web_search" && o.key == "user_location"))
		if !ok {
			return cfg, errdefs.InvalidArgument("%s.%s is not an option of the %s tool", path, o.key, name)
		}
		opath := path + "." + o.key
		var v json.RawMessage
		switch o.key {
		case "url_sources":
			// Every source contributing URLs is the default; the Messages
			// API has no other (unsupported.go).
			us, err := decodeURLSources(o.raw, opath)
			if err != nil {
				return cfg, err
			}
			if string(us) == allURLSources {
				continue
			}
			return cfg, refuse(name+"."+o.key, opath)
		case "allowed_domains", "blocked_domains":
			// web_search takes a path after the host; web_fetch does not.
			v, err = decodeDomains(o.raw, opath, name == "web_search")
		case "max_content_tokens":
			v, err = decodeMaxContentTokens(o.raw, opath)
		case "user_location":
			v, err = decodeUserLocation(o.raw, opath)
		}
		if err != nil {
			return cfg, err
		}
		if cfg.Options == nil {
			cfg.Options = map[string]json.RawMessage{}
		}
		cfg.Options[o.key] = v
	}
	if cfg.Options["allowed_domains"] != nil && cfg.Options["blocked_domains"] != nil {
		return cfg, errdefs.InvalidArgument("%s: set allowed_domains or blocked_domains, not both", path)
	}
	return cfg, nil
}

// Bounds on the web tools' options.
const (
	maxWebDomains        = 64
	maxWebDomain         = 255
	maxWebContentTokens  = 1_000_000
	maxUserLocationField = 255
)

// decodeDomains checks a web tool's domain list, as the API documents it:
// 1 to maxWebDomains plain host names (like docs.example.com: no scheme,
// no port), with a path after the host where paths are allowed.
func decodeDomains(raw json.RawMessage, path string, paths bool) (json.RawMessage, error) {
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errdefs.InvalidArgument("%s: want a list of domain names", path)
	}
	if len(list) == 0 || len(list) > maxWebDomains {
		return nil, errdefs.InvalidArgument("%s: want 1 to %d domain names (omit it, or null, for none)", path, maxWebDomains)
	}
	for i, d := range list {
		host, rest, hasPath := strings.Cut(d, "/")
		if host == "" || len(d) > maxWebDomain || strings.ContainsAny(host, ":@") || hasPath && (!paths || rest == "") ||
			strings.IndexFunc(d, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
			form := "a plain host name like docs.example.com, without a scheme, port or path"
			if paths {
				form = "a plain host name like docs.example.com, without a scheme or port, with an optional path"
			}
			return nil, errdefs.InvalidArgument("%s[%d]: %q is not %s (at most %d bytes)", path, i, d, form, maxWebDomain)
		}
	}
	return json.Marshal(list)
}

// decodeMaxContentTokens checks web_fetch's max_content_tokens.
func decodeMaxContentTokens(raw json.RawMessage, path string) (json.RawMessage, error) {
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil || n < 1 || n > maxWebContentTokens {
		return nil, errdefs.InvalidArgument("%s: want a whole number from 1 to %d", path, maxWebContentTokens)
	}
	return json.Marshal(n)
}

// decodeUserLocation checks web_search's user_location: type
// "approximate" with an optional city, region, two-letter country and
// timezone.
func decodeUserLocation(raw json.RawMessage, path string) (json.RawMessage, error) {
	var l struct {
		Type     string  `json:"type"`
		City     *string `json:"city"`
		Region   *string `json:"region"`
		Country  *string `json:"country"`
		Timezone *string `json:"timezone"`
	}
	if err := decodeObject(raw, path, &l); err != nil {
		return nil, err
	}
	if l.Type != "approximate" {
		return nil, errdefs.InvalidArgument("%s.type: want \"approximate\"", path)
	}
	out := map[string]string{"type": l.Type}
	for k, v := range map[string]*string{"city": l.City, "region": l.Region, "country": l.Country, "timezone": l.Timezone} {
		if v == nil {
			continue
		}
		if *v == "" || len(*v) > maxUserLocationField || strings.IndexFunc(*v, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
			return nil, errdefs.InvalidArgument("%s.%s: want 1 to %d printable characters", path, k, maxUserLocationField)
		}
		out[k] = *v
	}
	if c, ok := out["country"]; ok && (len(c) != 2 || strings.ToUpper(c) != c) {
		return nil, errdefs.InvalidArgument("%s.country: want a two-letter ISO 3166-1 code, like US", path)
	}
	return json.Marshal(out)
}

// allURLSources is url_sources in its default form, as decodeURLSources
// returns it: every source may contribute URLs.
const allURLSources = `{"client_tool_results":{"type":"all"},"server_tool_results":{"type":"all"},"user_input":{"type":"all"}}`

// decodeURLSources validates web_fetch's url_sources and returns it in
// object form: each member is "all", "none" or {type, tools?}.
func decodeURLSources(raw json.RawMessage, path string) (json.RawMessage, error) {
	var in map[string]json.RawMessage
	if err := field(raw, path, &in); err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, k := range []string{"client_tool_results", "server_tool_results", "user_input"} {
		v, ok := in[k]
		delete(in, k)
		p := path + "." + k
		allowed := []string{"all", "none", "only", "except"}
		if k == "user_input" {
			allowed = []string{"all", "none"}
		}
		if !ok || isNull(v) {
			out[k] = map[string]string{"type": "all"}
			continue
		}
		var typ string
		var tools []json.RawMessage
		if jsonKind(v) == "a string" {
			_ = json.Unmarshal(v, &typ)
		} else {
			var obj struct {
				Type  string            `json:"type"`
				Tools []json.RawMessage `json:"tools"`
			}
			if err := field(v, p, &obj); err != nil {
				return nil, err
			}
			typ, tools = obj.Type, obj.Tools
		}
		if !slices.Contains(allowed, typ) {
			return nil, enumError(p+".type", typ, allowed)
		}
		if typ == "only" || typ == "except" {
			refs := []map[string]string{}
			for i, t := range tools {
				var ref struct {
					Type *string `json:"type"`
					Name string  `json:"name"`
				}
				if err := field(t, fmt.Sprintf("%s.tools[%d]", p, i), &ref); err != nil {
					return nil, err
				}
				if ref.Name == "" {
					return nil, errdefs.InvalidArgument("%s.tools[%d].name is required", p, i)
				}
				refs = append(refs, map[string]string{"type": "tool_reference", "name": ref.Name})
			}
			out[k] = map[string]any{"type": typ, "tools": refs}
		} else {
			out[k] = map[string]string{"type": typ}
		}
	}
	for k := range in {
		return nil, errdefs.InvalidArgument("%s: %q is not a known field", path, k)
	}
	b, err := json.Marshal(out)
	return b, err
}

func decodeMCPToolset(raw json.RawMessage, path string) (tool, error) {
	var in struct {
		Type          string            `json:"type"`
		MCPServerName *string           `json:"mcp_server_name"`
		DefaultConfig json.RawMessage   `json:"default_config"`
		Configs       []json.RawMessage `json:"configs"`
	}
	if err := field(raw, path, &in); err != nil {
		return tool{}, err
	}
	if in.MCPServerName == nil {
		return tool{}, errdefs.InvalidArgument("%s.mcp_server_name is required", path)
	}
	if err := checkLen(*in.MCPServerName, path+".mcp_server_name", 1, 255); err != nil {
		return tool{}, err
	}
	def, err := decodeDefault(in.DefaultConfig, path+".default_config", "always_ask")
	if err != nil {
		return tool{}, err
	}
	configs := []toolConfig{}
	seen := map[string]bool{}
	for j, c := range in.Configs {
		cpath := fmt.Sprintf("%s.configs[%d]", path, j)
		var cin struct {
			Name             *string         `json:"name"`
			Enabled          *bool           `json:"enabled"`
			PermissionPolicy json.RawMessage `json:"permission_policy"`
		}
		if err := field(c, cpath, &cin); err != nil {
			return tool{}, err
		}
		if cin.Name == nil {
			return tool{}, errdefs.InvalidArgument("%s.name is required", cpath)
		}
		if err := checkLen(*cin.Name, cpath+".name", 1, 255); err != nil {
			return tool{}, err
		}
		if seen[*cin.Name] {
			return tool{}, errdefs.InvalidArgument("%s.name: %q is configured twice", cpath, *cin.Name)
		}
		seen[*cin.Name] = true
		cfg := toolConfig{Name: *cin.Name, Enabled: def.Enabled}
		if cin.Enabled != nil {
			cfg.Enabled = *cin.Enabled
		}
		if cfg.PermissionPolicy, err = decodePolicy(cin.PermissionPolicy, cpath+".permission_policy", def.PermissionPolicy.Type); err != nil {
			return tool{}, err
		}
		configs = append(configs, cfg)
	}
	return tool{Type: mcpToolset, MCPServerName: *in.MCPServerName, DefaultConfig: &def, Configs: &configs}, nil
}

func decodeCustomTool(raw json.RawMessage, path string) (tool, error) {
	var in struct {
		Type        string          `json:"type"`
		Name        *string         `json:"name"`
		Description *string         `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	if err := field(raw, path, &in); err != nil {
		return tool{}, err
	}
	if in.Name == nil {
		return tool{}, errdefs.InvalidArgument("%s.name is required", path)
	}
	if !customToolName.MatchString(*in.Name) {
		return tool{}, errdefs.InvalidArgument("%s.name: %q must be 1 to 128 letters, digits, underscores or hyphens", path, truncate(*in.Name))
	}
	if in.Description == nil {
		return tool{}, errdefs.InvalidArgument("%s.description is required", path)
	}
	if err := checkLen(*in.Description, path+".description", 0, 10_000); err != nil {
		return tool{}, err
	}
	if !present(in.InputSchema) || isNull(in.InputSchema) {
		// The Go SDK omits an input_schema left at its zero value, so an
		// absent schema is the empty object schema rather than an error.
		in.InputSchema = json.RawMessage(`{"type":"object"}`)
	}
	var schema map[string]json.RawMessage
	if jsonKind(in.InputSchema) != "an object" {
		return tool{}, errdefs.InvalidArgument("%s.input_schema: expected an object, got %s", path, jsonKind(in.InputSchema))
	}
	if err := json.Unmarshal(in.InputSchema, &schema); err != nil {
		return tool{}, jsonError(err, path+".input_schema")
	}
	if t, ok := schema["type"]; ok {
		var s string
		if json.Unmarshal(t, &s) != nil || s != "object" {
			return tool{}, errdefs.InvalidArgument("%s.input_schema.type must be \"object\"", path)
		}
	}
	schema["type"] = json.RawMessage(`"object"`)
	if p, ok := schema["properties"]; ok && !isNull(p) && jsonKind(p) != "an object" {
		return tool{}, errdefs.InvalidArgument("%s.input_schema.properties: expected an object, got %s", path, jsonKind(p))
	}
	if r, ok := schema["required"]; ok && !isNull(r) {
		var req []string
		if err := field(r, path+".input_schema.required", &req); err != nil {
			return tool{}, err
		}
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return tool{}, err
	}
	return tool{Type: customTool, Name: *in.Name, Description: in.Description, InputSchema: b}, nil
}
