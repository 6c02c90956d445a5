package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// TestTenantModelKey: a tenant's model_api_key credential, in a vault its
// session names, carries that session's model requests, to the
// credential's base URL when it has one, else to the operator's; another
// tenant's session still runs on the operator's key; the key never shows
// in a response; and a base URL that is not https (beyond loopback where
// private networks are allowed) is refused.
func TestTenantModelKey(t *testing.T) {
	const operatorKey, tenantKey = "sk-operator-SECRET", "sk-tenant-a-SECRET"
	operatorAPI := newMessagesAPI(t)
	tenantAPI := newMessagesAPI(t)
	srv := servertest.Start(t, pgtest.New(t), server.Config{
		NodeID: "node-a", Model: "anthropic", AnthropicBaseURL: operatorAPI.URL, AnthropicAPIKey: operatorKey,
		MCPAllowPrivateNetworks: true,
	})
	base := "http://" + srv.HTTPAddr()
	a := withKey(servertest.TenantKey(t, srv, tenant.Default))
	b := withKey(servertest.TenantKey(t, srv, "tenant_b"))

	vault := postJSON(t, a, base+"/v1/vaults", map[string]any{"display_name": "models"})
	vaultURL := base + "/v1/vaults/" + vault["id"].(string) + "/credentials"
	for _, bad := range []map[string]any{
		{"type": "model_api_key", "api_key": tenantKey, "base_url": "http://models.example.com"},
		{"type": "model_api_key", "api_key": tenantKey, "base_url": "https://user:pw@models.example.com"},
		{"type": "model_api_key", "base_url": tenantAPI.URL},
	} {
		if code, _, body := postStatus(t, a, vaultURL, map[string]any{"auth": bad}); code != http.StatusBadRequest || strings.Contains(body, tenantKey) {
			t.Errorf("credential %v: %d %s, want a 400 without the key", bad, code, body)
		}
	}
	cred := postJSON(t, a, vaultURL, map[string]any{"auth": map[string]any{"type": "model_api_key", "api_key": tenantKey, "base_url": tenantAPI.URL}})
	if raw, _ := json.Marshal(cred); bytes.Contains(raw, []byte(tenantKey)) || cred["auth"].(map[string]any)["base_url"] != tenantAPI.URL {
		t.Errorf("credential = %s", raw)
	}
	if code, _, body := postStatus(t, a, vaultURL, map[string]any{"auth": map[string]any{"type": "model_api_key", "api_key": "sk-second"}}); code != http.StatusConflict {
		t.Errorf("a second model key in the vault: %d %s, want 409", code, body)
	}

	n := 0
	session := func(c *http.Client, vaults ...any) string {
		n++
		agent := postJSON(t, c, base+"/v1/agents", map[string]any{"name": fmt.Sprint("m", n), "model": "claude-test"})
		env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": fmt.Sprint("e", n)})
		body := map[string]any{"agent": agent["id"], "environment_id": env["id"]}
		if len(vaults) > 0 {
			body["vault_ids"] = vaults
		}
		return postJSON(t, c, base+"/v1/sessions", body)["id"].(string)
	}
	turn(t, a, base, session(a, vault["id"]), "mine")
	turn(t, b, base, session(b), "theirs")
	turn(t, a, base, session(a), "no vault")

	tenantAPI.mu.Lock()
	tenantKeys := append([]string(nil), tenantAPI.keys...)
	tenantAPI.mu.Unlock()
	operatorAPI.mu.Lock()
	operatorKeys := append([]string(nil), operatorAPI.keys...)
	operatorAPI.mu.Unlock()
	if len(tenantKeys) != 1 || tenantKeys[0] != tenantKey {
		t.Errorf("the tenant's base URL got keys %q, want its own key once", tenantKeys)
	}
	if len(operatorKeys) != 2 || operatorKeys[0] != operatorKey || operatorKeys[1] != operatorKey {
		t.Errorf("the operator's base URL got keys %q, want the operator's twice", operatorKeys)
	}

	// Without a base URL, the tenant's key goes to the operator's; the
	// first of the session's vaults holding a key wins.
	vault2 := postJSON(t, a, base+"/v1/vaults", map[string]any{"display_name": "models 2"})
	postJSON(t, a, base+"/v1/vaults/"+vault2["id"].(string)+"/credentials", map[string]any{"auth": map[string]any{"type": "model_api_key", "api_key": "sk-tenant-a-second"}})
	turn(t, a, base, session(a, vault2["id"], vault["id"]), "first vault wins")
	operatorAPI.mu.Lock()
	defer operatorAPI.mu.Unlock()
	if n := len(operatorAPI.keys); n != 3 || operatorAPI.keys[2] != "sk-tenant-a-second" {
		t.Errorf("the operator's base URL got keys %q, want the first vault's key last", operatorAPI.keys)
	}
}

// On a node with the fake model, a model_api_key is refused: it would not
// be used.
func TestTenantModelKeyRefusedWithFake(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a"})
	base := "http://" + srv.HTTPAddr()
	a := withKey(servertest.TenantKey(t, srv, tenant.Default))
	vault := postJSON(t, a, base+"/v1/vaults", map[string]any{"display_name": "models"})
	code, _, body := postStatus(t, a, base+"/v1/vaults/"+vault["id"].(string)+"/credentials", map[string]any{"auth": map[string]any{"type": "model_api_key", "api_key": "sk-x"}})
	if code != http.StatusBadRequest || !strings.Contains(body, "model_api_key") {
		t.Errorf("model_api_key on a fake-model node: %d %s, want 400", code, body)
	}
}
