package publicapi

import (
	"fmt"
	"strings"
	"testing"
)

func TestEnvironments(t *testing.T) {
	a := setup(t, nil)
	e := a.ok("POST", "/v1/environments", map[string]any{"name": "default"})
	id := e["id"].(string)
	if !strings.HasPrefix(id, "env_") || e["type"] != "environment" || e["description"] != nil || e["archived_at"] != nil || e["scope"] != "organization" {
		t.Fatalf("created %v", e)
	}
	cfg := e["config"].(map[string]any)
	// What the sandbox really gets: no network, said in the API's words.
	if n := cfg["networking"].(map[string]any); cfg["type"] != "cloud" || n["type"] != "limited" || fmt.Sprint(n["allowed_hosts"]) != "[]" || n["allow_package_managers"] != false || n["allow_mcp_servers"] != false {
		t.Fatalf("default config = %v", cfg)
	}
	pk := cfg["packages"].(map[string]any)
	for _, m := range []string{"apt", "cargo", "gem", "go", "npm", "pip"} {
		if l, ok := pk[m].([]any); !ok || len(l) != 0 {
			t.Fatalf("packages.%s = %v", m, pk[m])
		}
	}
	msg := a.fail(409, "POST", "/v1/environments", map[string]any{"name": "default"})
	if !strings.Contains(msg, `"default"`) {
		t.Fatalf("duplicate message %q", msg)
	}
	if r := a.do("POST", "/v1/environments", map[string]any{"name": "default"}); r.header.Get("x-should-retry") != "false" {
		t.Fatalf("duplicate name: x-should-retry %q", r.header.Get("x-should-retry"))
	}
	// Same name in another tenant is fine.
	a.ok("POST", "/v1/environments", map[string]any{"name": "default"}, "X-Test-Tenant", "tenant_b")

	lim := a.ok("POST", "/v1/environments", map[string]any{"name": "locked", "description": "d", "metadata": map[string]any{"a": "1", "b": "2"},
		"config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{}, "allow_mcp_servers": false}, "packages": map[string]any{"pip": []string{}}}})
	n := lim["config"].(map[string]any)["networking"].(map[string]any)
	if n["type"] != "limited" || n["allow_package_managers"] != false || n["allow_mcp_servers"] != false || fmt.Sprint(n["allowed_hosts"]) != "[]" {
		t.Fatalf("limited = %v", n)
	}
	if p := lim["config"].(map[string]any)["packages"].(map[string]any); fmt.Sprint(p["pip"]) != "[]" || p["type"] != "packages" || p["apt"] == nil {
		t.Fatalf("packages = %v", p)
	}
	lid := lim["id"].(string)
	// Update: metadata patch (null and "" delete), description null clears.
	up := a.ok("POST", "/v1/environments/"+lid, map[string]any{"description": nil, "metadata": map[string]any{"a": nil, "b": "", "c": "3"}, "config": map[string]any{"type": "cloud"}})
	if up["description"] != nil || fmt.Sprint(up["metadata"]) != "map[c:3]" || up["config"].(map[string]any)["type"] != "cloud" || up["name"] != "locked" {
		t.Fatalf("updated %v", up)
	}
	// An update asking for a network is refused, and changes nothing.
	a.fail(400, "POST", "/v1/environments/"+lid, map[string]any{"config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "unrestricted"}}})
	a.fail(409, "POST", "/v1/environments/"+lid, map[string]any{"name": "default"})
	if g := a.ok("GET", "/v1/environments/"+lid, nil); g["id"] != lid {
		t.Fatalf("get = %v", g)
	}
	a.fail(404, "GET", "/v1/environments/"+lid, nil, "X-Test-Tenant", "tenant_b")
	a.fail(404, "DELETE", "/v1/environments/"+lid, nil, "X-Test-Tenant", "tenant_b")

	if l := a.ok("GET", "/v1/environments", nil); len(l["data"].([]any)) != 2 {
		t.Fatalf("list = %v", l)
	}
	if ar := a.ok("POST", "/v1/environments/"+lid+"/archive", nil); ar["archived_at"] == nil {
		t.Fatalf("archive = %v", ar)
	}
	if l := a.ok("GET", "/v1/environments", nil); len(l["data"].([]any)) != 1 {
		t.Fatalf("list without archived = %v", l)
	}
	if l := a.ok("GET", "/v1/environments?include_archived=true&limit=1", nil); len(l["data"].([]any)) != 1 || l["next_page"] == nil {
		t.Fatalf("list page = %v", l)
	}
	del := a.ok("DELETE", "/v1/environments/"+lid, nil)
	if del["id"] != lid || del["type"] != "environment_deleted" {
		t.Fatalf("delete = %v", del)
	}
	a.fail(404, "GET", "/v1/environments/"+lid, nil)
}

func TestEnvironmentValidation(t *testing.T) {
	a := setup(t, nil)
	tests := []struct {
		name string
		body any
		want string
	}{
		{"no name", map[string]any{}, "name is required"},
		{"config type", map[string]any{"name": "x", "config": map[string]any{"type": "moon"}}, `config.type: "moon"`},
		{"config no type", map[string]any{"name": "x", "config": map[string]any{}}, "config.type is required"},
		{"networking type", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "some"}}}, "config.networking.type"},
		{"hosts on unrestricted", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "unrestricted", "allowed_hosts": []string{"a"}}}}, "limited networking only"},
		{"packages wrong type", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "packages": map[string]any{"pip": "requests"}}}, "config.packages.pip: expected an array"},
		{"packages unknown manager", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "packages": map[string]any{"brew": []string{"x"}}}}, `"brew"`},
		{"self hosted with packages", map[string]any{"name": "x", "config": map[string]any{"type": "self_hosted", "packages": map[string]any{}}}, "a self_hosted environment has type only"},
		// The API says only what is enforced: a network the sandbox would
		// not get is refused, never stored and ignored.
		{"unrestricted networking", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "unrestricted"}}}, "unrestricted networking is not granted to this tenant"},
		{"limited with an IP", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"pypi.org", "10.0.0.1"}}}}, "config.networking.allowed_hosts[1]"},
		{"limited with a bare wildcard", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"*"}}}}, "config.networking.allowed_hosts[0]"},
		{"limited with a URL", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"https://pypi.org"}}}}, "not a host name"},
		{"limited with package managers", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allow_package_managers": true}}}, "config.networking.allow_package_managers: this corral has no package mirrors"},
		{"packages", map[string]any{"name": "x", "config": map[string]any{"type": "cloud", "packages": map[string]any{"pip": []string{"requests"}}}}, "config.packages.pip: this corral has no pip package mirror"},
		{"scope", map[string]any{"name": "x", "scope": "galaxy"}, "scope"},
		{"metadata", map[string]any{"name": "x", "metadata": "a=b"}, "metadata: expected an object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if msg := a.fail(400, "POST", "/v1/environments", tc.body); !strings.Contains(msg, tc.want) {
				t.Fatalf("message %q does not contain %q", msg, tc.want)
			}
		})
	}
}

// Limited networking with allowed hosts is accepted and reported as
// stored: lowercased, without trailing dots, duplicates dropped. The host
// enforces it (hostagent/egress).
func TestEnvironmentAllowedHosts(t *testing.T) {
	a := setup(t, nil)
	env := a.ok("POST", "/v1/environments", map[string]any{"name": "net",
		"config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"PyPI.org.", "*.files.example", "pypi.org"}}}})
	n := env["config"].(map[string]any)["networking"].(map[string]any)
	if n["type"] != "limited" || fmt.Sprint(n["allowed_hosts"]) != "[pypi.org *.files.example]" || n["allow_package_managers"] != false || n["allow_mcp_servers"] != false {
		t.Fatalf("networking = %v", n)
	}
}
