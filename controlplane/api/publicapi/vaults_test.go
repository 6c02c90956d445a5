package publicapi

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const testToken = "tok-4e0b7c1d-the-secret"

func bearer(url string) map[string]any {
	return map[string]any{"type": "static_bearer", "token": testToken, "mcp_server_url": url}
}

// The vault and credential shapes, field for field as the SDK reads them;
// the token is never in a response, nor in an error.
func TestVaultShapes(t *testing.T) {
	a := setup(t, nil)
	v := a.ok("POST", "/v1/vaults", map[string]any{"display_name": "Production", "metadata": map[string]any{"team": "x"}})
	id, _ := v["id"].(string)
	if !strings.HasPrefix(id, "vlt_") || v["type"] != "vault" || v["display_name"] != "Production" || v["metadata"].(map[string]any)["team"] != "x" ||
		v["archived_at"] != nil || v["created_at"] == nil || v["updated_at"] == nil || len(v) != 7 {
		t.Fatalf("vault = %v", v)
	}
	c := a.ok("POST", "/v1/vaults/"+id+"/credentials", map[string]any{"display_name": "docs", "auth": bearer("https://mcp.example.com/mcp")})
	cid, _ := c["id"].(string)
	auth, _ := c["auth"].(map[string]any)
	if !strings.HasPrefix(cid, "vcrd_") || c["type"] != "vault_credential" || c["vault_id"] != id || c["display_name"] != "docs" ||
		auth["type"] != "static_bearer" || auth["mcp_server_url"] != "https://mcp.example.com/mcp" || len(auth) != 2 ||
		c["archived_at"] != nil || len(c["metadata"].(map[string]any)) != 0 || len(c) != 9 {
		t.Fatalf("credential = %v", c)
	}
	for _, r := range []reply{
		a.do("GET", "/v1/vaults/"+id+"/credentials/"+cid, nil),
		a.do("GET", "/v1/vaults/"+id+"/credentials", nil),
		a.do("POST", "/v1/vaults/"+id+"/credentials/"+cid, map[string]any{"auth": map[string]any{"type": "static_bearer", "token": testToken + "2"}, "metadata": map[string]any{"k": "v"}}),
		a.do("POST", "/v1/vaults/"+id+"/credentials", map[string]any{"auth": bearer("https://mcp.example.com/mcp/")}), // a second for the server: 409
		a.do("POST", "/v1/vaults/"+id+"/credentials", map[string]any{"auth": map[string]any{"type": "static_bearer", "token": testToken + "\n", "mcp_server_url": "https://x.example"}}),
		a.do("POST", "/v1/vaults/"+id+"/credentials", map[string]any{"auth": map[string]any{"type": "static_bearer", "token": testToken, "mcp_server_url": "ftp://x"}}),
		a.do("POST", "/v1/vaults/"+id+"/credentials", `{"auth":{"type":"static_bearer","token":"`+testToken+`","mcp_server_url":"https://x.example","extra":1}}`),
		a.do("POST", "/v1/vaults/"+id+"/credentials", `{"auth":{"type":"static_bearer","token":"`+testToken+`",`),
	} {
		if strings.Contains(string(r.body), "tok-4e0b") {
			t.Errorf("a response echoes the token: %d %s", r.status, r.body)
		}
	}
	got := a.ok("GET", "/v1/vaults/"+id+"/credentials/"+cid, nil)
	if got["metadata"].(map[string]any)["k"] != "v" {
		t.Fatalf("updated credential = %v", got)
	}
	if l := a.ok("GET", "/v1/vaults/"+id+"/credentials", nil)["data"].([]any); len(l) != 1 {
		t.Fatalf("credentials = %v", l)
	}
	if msg := a.fail(400, "POST", "/v1/vaults/"+id+"/credentials/"+cid, map[string]any{"auth": map[string]any{"type": "static_bearer", "mcp_server_url": "https://other.example"}}); !strings.Contains(msg, "cannot change") {
		t.Fatalf("changing the URL: %s", msg)
	}
	up := a.ok("POST", "/v1/vaults/"+id, map[string]any{"display_name": "Prod", "metadata": map[string]any{"team": nil, "env": "p"}})
	if up["display_name"] != "Prod" || fmt.Sprint(up["metadata"]) != "map[env:p]" {
		t.Fatalf("updated vault = %v", up)
	}

	// Archive: the credential goes with the vault, and no session may name it.
	arch := a.ok("POST", "/v1/vaults/"+id+"/archive", nil)
	if arch["archived_at"] == nil {
		t.Fatalf("archived vault = %v", arch)
	}
	if c := a.ok("GET", "/v1/vaults/"+id+"/credentials/"+cid, nil); c["archived_at"] == nil {
		t.Fatalf("credential of an archived vault = %v", c)
	}
	if l := a.ok("GET", "/v1/vaults", nil)["data"].([]any); len(l) != 0 {
		t.Fatalf("archived vaults listed by default: %v", l)
	}
	if l := a.ok("GET", "/v1/vaults?include_archived=true", nil)["data"].([]any); len(l) != 1 {
		t.Fatalf("include_archived: %v", l)
	}
	a.fail(409, "POST", "/v1/vaults/"+id, map[string]any{"display_name": "x"})
	a.fail(409, "POST", "/v1/vaults/"+id+"/credentials", map[string]any{"auth": bearer("https://new.example/mcp")})

	if d := a.ok("DELETE", "/v1/vaults/"+id+"/credentials/"+cid, nil); d["id"] != cid || d["type"] != "vault_credential_deleted" {
		t.Fatalf("deleted credential = %v", d)
	}
	if d := a.ok("DELETE", "/v1/vaults/"+id, nil); d["id"] != id || d["type"] != "vault_deleted" {
		t.Fatalf("deleted vault = %v", d)
	}
	a.fail(404, "GET", "/v1/vaults/"+id, nil)
}

// Bounds: names, metadata, tokens, URLs, kinds, and the pages of a list.
func TestVaultBounds(t *testing.T) {
	a := setup(t, nil)
	id := a.ok("POST", "/v1/vaults", map[string]any{"display_name": "v"})["id"].(string)
	for body, want := range map[string]string{
		`{}`:                  "display_name is required",
		`{"display_name":""}`: "display_name must not be empty",
		`{"display_name":"` + strings.Repeat("n", 256) + `"}`:                     "at most 255",
		`{"display_name":"v","metadata":{"` + strings.Repeat("k", 65) + `":"v"}}`: "metadata key",
		`{"display_name":"v","other":1}`:                                          "not a known field",
	} {
		if msg := a.fail(400, "POST", "/v1/vaults", body); !strings.Contains(msg, want) {
			t.Errorf("%.60s: %q, want %q", body, msg, want)
		}
	}
	cred := "/v1/vaults/" + id + "/credentials"
	for body, want := range map[string]string{
		`{}`: "auth is required",
		`{"auth":{"token":"t","mcp_server_url":"https://m.example"}}`:                                                                          "auth.type is required",
		`{"auth":{"type":"bearer","token":"t"}}`:                                                                                               "is not one of",
		`{"auth":{"type":"static_bearer","mcp_server_url":"https://m.example"}}`:                                                               "auth.token is required",
		`{"auth":{"type":"static_bearer","token":"","mcp_server_url":"https://m.example"}}`:                                                    "must not be empty",
		`{"auth":{"type":"static_bearer","token":"` + strings.Repeat("t", 8193) + `","mcp_server_url":"https://m.example"}}`:                   "at most 8192",
		`{"auth":{"type":"static_bearer","token":"a b","mcp_server_url":"https://m.example"}}`:                                                 "visible ASCII",
		`{"auth":{"type":"static_bearer","token":"t"}}`:                                                                                        "auth.mcp_server_url is required",
		`{"auth":{"type":"static_bearer","token":"t","mcp_server_url":"https://u:p@m.example"}}`:                                               "user information",
		`{"auth":{"type":"static_bearer","token":"t","mcp_server_url":"https://m.example/` + strings.Repeat("p", 2048) + `"}}`:                 "at most 2047",
		`{"auth":{"type":"static_bearer","token":"t","mcp_server_url":"https://m.example"},"display_name":"` + strings.Repeat("n", 256) + `"}`: "at most 255",
	} {
		if msg := a.fail(400, "POST", cred, body); !strings.Contains(msg, want) {
			t.Errorf("%.70s: %q, want %q", body, msg, want)
		}
	}
	// At most 20 active credentials; an archived one makes room.
	var first string
	for i := range 20 {
		c := a.ok("POST", cred, map[string]any{"auth": bearer(fmt.Sprintf("https://m%d.example/mcp", i))})
		if i == 0 {
			first = c["id"].(string)
		}
	}
	if msg := a.fail(409, "POST", cred, map[string]any{"auth": bearer("https://m20.example/mcp")}); !strings.Contains(msg, "20 active credentials") {
		t.Fatalf("21st credential: %s", msg)
	}
	a.ok("POST", cred+"/"+first+"/archive", nil)
	a.ok("POST", cred, map[string]any{"auth": bearer("https://m20.example/mcp")})
	// Pages of 7: 20 active credentials in 3 pages, each once.
	seen := map[string]bool{}
	path := cred + "?limit=7"
	for range 5 {
		p := a.ok("GET", path, nil)
		for _, c := range p["data"].([]any) {
			seen[c.(map[string]any)["id"].(string)] = true
		}
		next, _ := p["next_page"].(string)
		if next == "" {
			break
		}
		path = cred + "?limit=7&page=" + next
	}
	if len(seen) != 20 {
		t.Fatalf("listed %d credentials, want 20", len(seen))
	}
	a.fail(400, "GET", cred+"?limit=101", nil)
	vpage := a.ok("GET", "/v1/vaults?limit=1", nil)
	if _, ok := vpage["next_page"]; !ok {
		t.Fatalf("vault list lacks next_page: %v", vpage)
	}
	a.fail(400, "GET", cred+"?page="+fmt.Sprint(vpage["next_page"]), nil) // another list's cursor
}

// Sessions: vault_ids must name active vaults of the caller's tenant, and
// are reported as stored; another tenant can neither see nor use them.
func TestSessionVaultIDs(t *testing.T) {
	a := setup(t, nil)
	agent := a.ok("POST", "/v1/agents", map[string]any{"name": "a", "model": "m"})["id"].(string)
	env := a.ok("POST", "/v1/environments", map[string]any{"name": "e"})["id"].(string)
	v1 := a.ok("POST", "/v1/vaults", map[string]any{"display_name": "one"})["id"].(string)
	v2 := a.ok("POST", "/v1/vaults", map[string]any{"display_name": "two"})["id"].(string)
	s := a.ok("POST", "/v1/sessions", map[string]any{"agent": agent, "environment_id": env, "vault_ids": []string{v2, v1}})
	if fmt.Sprint(s["vault_ids"]) != fmt.Sprint([]any{v2, v1}) {
		t.Fatalf("vault_ids = %v", s["vault_ids"])
	}
	if got := a.ok("GET", "/v1/sessions/"+s["id"].(string), nil); fmt.Sprint(got["vault_ids"]) != fmt.Sprint([]any{v2, v1}) {
		t.Fatalf("stored vault_ids = %v", got["vault_ids"])
	}
	for body, want := range map[string]string{
		fmt.Sprintf(`{"agent":%q,"environment_id":%q,"vault_ids":["vlt_nope"]}`, agent, env):      "vlt_nope does not exist",
		fmt.Sprintf(`{"agent":%q,"environment_id":%q,"vault_ids":[%q,%q]}`, agent, env, v1, v1):   "named twice",
		fmt.Sprintf(`{"agent":%q,"environment_id":%q,"vault_ids":"x"}`, agent, env):               "expected an array",
		fmt.Sprintf(`{"agent":%q,"environment_id":%q,"vault_ids":["a/b"]}`, agent, env):           "not the id of a vault",
		fmt.Sprintf(`{"agent":%q,"environment_id":%q,"vault_ids":[%s]}`, agent, env, manyIDs(21)): "at most 20",
	} {
		if msg := a.fail(400, "POST", "/v1/sessions", body); !strings.Contains(msg, want) {
			t.Errorf("%.90s: %q, want %q", body, msg, want)
		}
	}
	a.ok("POST", "/v1/vaults/"+v1+"/archive", nil)
	if msg := a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agent, "environment_id": env, "vault_ids": []string{v1}}); !strings.Contains(msg, "archived") {
		t.Fatalf("archived vault: %s", msg)
	}

	// tenant_b: the vault is not there for it, in any route.
	b := []string{"X-Test-Tenant", "tenant_b"}
	a.fail(404, "GET", "/v1/vaults/"+v2, nil, b...)
	a.fail(404, "GET", "/v1/vaults/"+v2+"/credentials", nil, b...)
	a.fail(404, "POST", "/v1/vaults/"+v2+"/credentials", map[string]any{"auth": bearer("https://m.example")}, b...)
	a.fail(404, "POST", "/v1/vaults/"+v2+"/archive", nil, b...)
	a.fail(404, "DELETE", "/v1/vaults/"+v2, nil, b...)
	if l := a.ok("GET", "/v1/vaults", nil, b...)["data"].([]any); len(l) != 0 {
		t.Fatalf("tenant_b lists %v", l)
	}
	agentB := a.ok("POST", "/v1/agents", map[string]any{"name": "a", "model": "m"}, b...)["id"].(string)
	envB := a.ok("POST", "/v1/environments", map[string]any{"name": "e"}, b...)["id"].(string)
	a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agentB, "environment_id": envB, "vault_ids": []string{v2}}, b...)
}

func manyIDs(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf(`"vlt_%d"`, i)
	}
	return strings.Join(ids, ",")
}

// mcp_oauth: the shape (expiry and refresh configuration, no secret), what
// an update may change, and the bounds.
func TestOAuthCredential(t *testing.T) {
	a := setup(t, nil)
	id := a.ok("POST", "/v1/vaults", map[string]any{"display_name": "v"})["id"].(string)
	cred := "/v1/vaults/" + id + "/credentials"
	exp := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	c := a.do("POST", cred, map[string]any{"auth": map[string]any{
		"type": "mcp_oauth", "mcp_server_url": "https://m.example/mcp", "access_token": "at-secret-1", "expires_at": exp,
		"refresh": map[string]any{"client_id": "cid", "refresh_token": "rt-secret-1", "token_endpoint": "https://auth.example/token",
			"token_endpoint_auth": map[string]any{"type": "client_secret_basic", "client_secret": "cs-secret-1"}, "scope": "read"},
	}})
	if c.status != 200 || strings.Contains(string(c.body), "secret-1") {
		t.Fatalf("create: %d %s", c.status, c.body)
	}
	m := c.json(t)
	auth := m["auth"].(map[string]any)
	r, _ := auth["refresh"].(map[string]any)
	if auth["type"] != "mcp_oauth" || auth["mcp_server_url"] != "https://m.example/mcp" || auth["expires_at"] == nil || len(auth) != 4 ||
		r["client_id"] != "cid" || r["token_endpoint"] != "https://auth.example/token" || r["scope"] != "read" || r["resource"] != nil || len(r) != 5 ||
		r["token_endpoint_auth"].(map[string]any)["type"] != "client_secret_basic" {
		t.Fatalf("credential = %s", c.body)
	}
	cid := m["id"].(string)
	up := a.do("POST", cred+"/"+cid, map[string]any{"auth": map[string]any{"type": "mcp_oauth", "access_token": "at-secret-2",
		"refresh": map[string]any{"refresh_token": "rt-secret-2", "scope": "write", "token_endpoint_auth": map[string]any{"type": "client_secret_basic", "client_secret": "cs-secret-2"}}}})
	if up.status != 200 || strings.Contains(string(up.body), "secret-2") || up.json(t)["auth"].(map[string]any)["refresh"].(map[string]any)["scope"] != "write" {
		t.Fatalf("update: %d %s", up.status, up.body)
	}
	a.fail(400, "POST", cred+"/"+cid, map[string]any{"auth": map[string]any{"type": "static_bearer", "token": "x"}})
	for body, want := range map[string]string{
		`{"auth":{"type":"mcp_oauth","refresh":{"client_id":"other"}}}`:                                 "cannot change",
		`{"auth":{"type":"mcp_oauth","refresh":{"token_endpoint_auth":{"type":"client_secret_post"}}}}`: "cannot change",
		`{"auth":{"type":"mcp_oauth","expires_at":"2001-01-01T00:00:00Z"}}`:                             "in the future",
		`{"auth":{"type":"mcp_oauth","mcp_server_url":"https://x.example"}}`:                            "cannot change",
	} {
		if msg := a.fail(400, "POST", cred+"/"+cid, body); !strings.Contains(msg, want) {
			t.Errorf("update %s: %q, want %q", body, msg, want)
		}
	}
	ok := `"mcp_server_url":"https://n.example/mcp","access_token":"at"`
	for body, want := range map[string]string{
		`{"auth":{"type":"mcp_oauth","mcp_server_url":"https://n.example/mcp"}}`:                                                                                                                                "auth.access_token is required",
		`{"auth":{"type":"mcp_oauth",` + ok + `,"expires_at":"yesterday"}}`:                                                                                                                                     "RFC 3339",
		`{"auth":{"type":"mcp_oauth",` + ok + `,"refresh":{"client_id":"c","refresh_token":"r","token_endpoint":"https://a.example/t"}}}`:                                                                       "token_endpoint_auth is required",
		`{"auth":{"type":"mcp_oauth",` + ok + `,"refresh":{"client_id":"c","refresh_token":"r","token_endpoint":"https://a.example/t","token_endpoint_auth":{"type":"none","client_secret":"s"}}}}`:             "does not go with type none",
		`{"auth":{"type":"mcp_oauth",` + ok + `,"refresh":{"client_id":"c","refresh_token":"r","token_endpoint":"https://a.example/t","token_endpoint_auth":{"type":"client_secret_post"}}}}`:                   "client_secret is required",
		`{"auth":{"type":"mcp_oauth",` + ok + `,"refresh":{"client_id":"c","refresh_token":"r","token_endpoint":"file:///etc","token_endpoint_auth":{"type":"none"}}}}`:                                         "token_endpoint",
		`{"auth":{"type":"mcp_oauth",` + ok + `,"refresh":{"client_id":"` + strings.Repeat("c", 1025) + `","refresh_token":"r","token_endpoint":"https://a.example/t","token_endpoint_auth":{"type":"none"}}}}`: "at most 1024",
	} {
		if msg := a.fail(400, "POST", cred, body); !strings.Contains(msg, want) {
			t.Errorf("create %.90s: %q, want %q", body, msg, want)
		}
	}
	// Without refresh: expires_at and refresh are null.
	plain := a.ok("POST", cred, map[string]any{"auth": map[string]any{"type": "mcp_oauth", "mcp_server_url": "https://p.example/mcp", "access_token": "at"}})
	if pa := plain["auth"].(map[string]any); pa["expires_at"] != nil || pa["refresh"] != nil || len(pa) != 4 {
		t.Fatalf("plain oauth = %v", pa)
	}
}

// environment_variable credentials: the shape the SDK reads (the secret
// never in a response or an error), one per variable, the variable's name
// fixed, the hosts replaced whole, and what is not enforced refused.
func TestEnvironmentVariableCredential(t *testing.T) {
	a := setup(t, nil)
	id := a.ok("POST", "/v1/vaults", map[string]any{"display_name": "env"})["id"].(string)
	base := "/v1/vaults/" + id + "/credentials"
	env := func(name string, hosts ...any) map[string]any {
		return map[string]any{"type": "environment_variable", "secret_name": name, "secret_value": testToken,
			"networking": map[string]any{"type": "limited", "allowed_hosts": hosts}}
	}
	c := a.ok("POST", base, map[string]any{"auth": env("API_TOKEN", "API.Example.com", "*.example.org", "api.example.com")})
	cid := c["id"].(string)
	want := `map[injection_location:map[body:false header:true] networking:map[allowed_hosts:[api.example.com *.example.org] type:limited] secret_name:API_TOKEN type:environment_variable]`
	if got := fmt.Sprint(c["auth"]); got != want {
		t.Fatalf("auth = %s, want %s", got, want)
	}
	var replies []reply
	for _, body := range []any{
		map[string]any{"auth": env("API_TOKEN", "x.example")}, // a second for the variable: 409
		map[string]any{"auth": env("1BAD", "x.example")},
		map[string]any{"auth": env("PATH", "x.example")},
		map[string]any{"auth": env("https_proxy", "x.example")},
		map[string]any{"auth": env("LD_PRELOAD", "x.example")},
		map[string]any{"auth": env("OK_NAME", "192.0.2.1")},
		map[string]any{"auth": env("OK_NAME", "https://x.example/")},
		map[string]any{"auth": env("OK_NAME")},
		map[string]any{"auth": env("OK_NAME", "a1.x", "a2.x", "a3.x", "a4.x", "a5.x", "a6.x", "a7.x", "a8.x", "a9.x", "a10.x", "a11.x", "a12.x", "a13.x", "a14.x", "a15.x", "a16.x", "a17.x")},
		map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "OK_NAME", "secret_value": testToken + "\n", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"x.example"}}}},
		map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "OK_NAME", "secret_value": testToken}},
		map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "OK_NAME", "secret_value": testToken, "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"x.example"}}, "injection_location": map[string]any{"header": false}}},
		map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "OK_NAME", "secret_value": testToken, "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"x.example"}}, "extra": 1}},
	} {
		r := a.do("POST", base, body)
		if r.status/100 != 4 {
			t.Errorf("%v: %d %s, want refused", body, r.status, r.body)
		}
		replies = append(replies, r)
	}
	replies = append(replies,
		a.do("GET", base+"/"+cid, nil), a.do("GET", base, nil),
		a.do("POST", base+"/"+cid, map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "OTHER"}}),
	)
	for _, r := range replies {
		if strings.Contains(string(r.body), "tok-4e0b") {
			t.Errorf("a response echoes the secret: %d %s", r.status, r.body)
		}
	}
	if msg := a.fail(400, "POST", base+"/"+cid, map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "OTHER"}}); !strings.Contains(msg, "cannot change") {
		t.Fatalf("renaming the variable: %s", msg)
	}
	up := a.ok("POST", base+"/"+cid, map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_value": testToken + "2",
		"networking": map[string]any{"type": "limited", "allowed_hosts": []string{"new.example"}}}})
	if got := fmt.Sprint(up["auth"].(map[string]any)["networking"]); got != "map[allowed_hosts:[new.example] type:limited]" {
		t.Fatalf("updated networking = %s", got)
	}
	if l := a.ok("GET", base, nil)["data"].([]any); len(l) != 1 || l[0].(map[string]any)["auth"].(map[string]any)["secret_name"] != "API_TOKEN" {
		t.Fatalf("credentials = %v", l)
	}
}
