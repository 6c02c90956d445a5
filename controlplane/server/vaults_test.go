package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/test/mcpserver"
)

// syncBuffer is a log sink tests read while the node writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestVaultBearerReachesMCPServer runs sessions end to end through a node:
// an MCP server that requires a bearer token serves the session whose
// vault holds the token as a static_bearer credential for its URL, and
// refuses the session without the vault, whose turn reports an
// mcp_authentication_failed_error. The token is in no response and no log
// line.
func TestVaultBearerReachesMCPServer(t *testing.T) {
	const token = "mcp-tok-7d1e5aa0-secret"
	mcpSrv := mcpserver.New()
	mcpSrv.RequireBearer(token)
	hs := httptest.NewServer(mcpSrv)
	defer hs.Close()
	logs := &syncBuffer{}
	srv := servertest.Start(t, pgtest.New(t), server.Config{
		NodeID: "node-a", MCPAllowPrivateNetworks: true,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))

	vault := postJSON(t, c, base+"/v1/vaults", map[string]any{"display_name": "calc"})
	cred := postJSON(t, c, base+"/v1/vaults/"+vault["id"].(string)+"/credentials", map[string]any{
		"auth": map[string]any{"type": "static_bearer", "token": token, "mcp_server_url": hs.URL + "/mcp/"},
	})
	if b, _ := json.Marshal(cred); bytes.Contains(b, []byte(token)) {
		t.Fatalf("the credential echoes its token: %s", b)
	}
	agent := postJSON(t, c, base+"/v1/agents", map[string]any{
		"name": "calc", "model": "fake",
		"mcp_servers": []any{map[string]any{"type": "url", "name": "calc", "url": hs.URL + "/mcp"}},
		"tools": []any{map[string]any{"type": "mcp_toolset", "mcp_server_name": "calc",
			"default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}}}},
	})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})

	// turn runs one turn that calls add and returns the frames' kinds and
	// the add result's text.
	turn := func(vaultIDs []string) (kinds []string, result string, errs []map[string]any) {
		t.Helper()
		sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"], "vault_ids": vaultIDs})
		sid := sess["id"].(string)
		stream, err := c.Get(base + "/v1/sessions/" + sid + "/events/stream?beta=true")
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Body.Close()
		postJSON(t, c, base+"/v1/sessions/"+sid+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tools add {"a":2,"b":3}`}}},
		}})
		frames := sseFrames(stream.Body)
		deadline := time.After(60 * time.Second)
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					t.Fatalf("stream ended after %v", kinds)
				}
				kinds = append(kinds, f.event)
				switch f.event {
				case "agent.mcp_tool_result":
					for _, b := range f.data["content"].([]any) {
						result += b.(map[string]any)["text"].(string)
					}
				case "session.error":
					errs = append(errs, f.data)
				case "session.status_idle":
					return kinds, result, errs
				}
			case <-deadline:
				t.Fatalf("no idle after %v", kinds)
			}
		}
	}

	kinds, result, errs := turn([]string{vault["id"].(string)})
	if result != "5" || len(errs) != 0 || mcpSrv.Calls("add") != 1 {
		t.Fatalf("with the vault: result %q, errors %v, add calls %d, frames %v", result, errs, mcpSrv.Calls("add"), kinds)
	}
	if mcpSrv.Refused() != 0 {
		t.Fatalf("the MCP server refused %d requests of the session with the vault", mcpSrv.Refused())
	}

	kinds, result, errs = turn(nil)
	if mcpSrv.Calls("add") != 1 || mcpSrv.Refused() == 0 {
		t.Fatalf("without the vault: add calls %d, refused %d, frames %v", mcpSrv.Calls("add"), mcpSrv.Refused(), kinds)
	}
	sawAuthErr := false
	for _, e := range errs {
		if inner, _ := e["error"].(map[string]any); inner["type"] == "mcp_authentication_failed_error" && inner["mcp_server_name"] == "calc" {
			sawAuthErr = true
		}
	}
	if !sawAuthErr || result == "5" {
		t.Fatalf("without the vault: errors %v, result %q", errs, result)
	}

	// Archived, the credential is no longer sent.
	postJSON(t, c, base+"/v1/vaults/"+vault["id"].(string)+"/credentials/"+cred["id"].(string)+"/archive", nil)
	refused := mcpSrv.Refused()
	resp, err := c.Get(base + "/v1/vaults/" + vault["id"].(string) + "/credentials/" + cred["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("get credential: %d", resp.StatusCode)
	}
	_, result, _ = turn([]string{vault["id"].(string)})
	if result == "5" || mcpSrv.Refused() == refused {
		t.Fatalf("an archived credential was used: result %q", result)
	}
	if strings.Contains(logs.String(), token) {
		t.Fatal("the node logged the token")
	}
}

// TestVaultOAuthRefreshThroughServer: an mcp_oauth credential whose access
// token expires within the minute is refreshed at its token endpoint
// (client_secret_post) before the session's MCP call, the new token reaches
// the server, the credential reports the new expiry (and no secret), and
// the next turn uses the stored token without refreshing again.
func TestVaultOAuthRefreshThroughServer(t *testing.T) {
	mcpSrv := mcpserver.New()
	mcpSrv.RequireBearer("at-new")
	hs := httptest.NewServer(mcpSrv)
	defer hs.Close()
	var mu sync.Mutex
	refreshes := 0
	tokenEP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		f := r.PostForm
		mu.Lock()
		refreshes++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if f.Get("grant_type") != "refresh_token" || f.Get("refresh_token") != "rt-old" || f.Get("client_id") != "cid" || f.Get("client_secret") != "cs-secret" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		_, _ = w.Write([]byte(`{"access_token":"at-new","token_type":"bearer","expires_in":3600,"refresh_token":"rt-new"}`))
	}))
	defer tokenEP.Close()
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", MCPAllowPrivateNetworks: true})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))

	vault := postJSON(t, c, base+"/v1/vaults", map[string]any{"display_name": "oauth"})
	credPath := base + "/v1/vaults/" + vault["id"].(string) + "/credentials"
	cred := postJSON(t, c, credPath, map[string]any{"auth": map[string]any{
		"type": "mcp_oauth", "mcp_server_url": hs.URL + "/mcp", "access_token": "at-old",
		"expires_at": time.Now().Add(30 * time.Second).UTC().Format(time.RFC3339Nano),
		"refresh": map[string]any{"client_id": "cid", "refresh_token": "rt-old", "token_endpoint": tokenEP.URL + "/token",
			"token_endpoint_auth": map[string]any{"type": "client_secret_post", "client_secret": "cs-secret"}, "scope": "tools"},
	}})
	agent := postJSON(t, c, base+"/v1/agents", map[string]any{
		"name": "calc", "model": "fake",
		"mcp_servers": []any{map[string]any{"type": "url", "name": "calc", "url": hs.URL + "/mcp"}},
		"tools": []any{map[string]any{"type": "mcp_toolset", "mcp_server_name": "calc",
			"default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}}}},
	})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})
	turn := func() string {
		t.Helper()
		sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"], "vault_ids": []any{vault["id"]}})
		sid := sess["id"].(string)
		stream, err := c.Get(base + "/v1/sessions/" + sid + "/events/stream?beta=true")
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Body.Close()
		postJSON(t, c, base+"/v1/sessions/"+sid+"/events?beta=true", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tools add {"a":20,"b":22}`}}},
		}})
		frames := sseFrames(stream.Body)
		deadline := time.After(60 * time.Second)
		result := ""
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					t.Fatal("stream ended")
				}
				switch f.event {
				case "agent.mcp_tool_result":
					for _, b := range f.data["content"].([]any) {
						result += b.(map[string]any)["text"].(string)
					}
				case "session.error":
					t.Fatalf("session.error: %v", f.data)
				case "session.status_idle":
					return result
				}
			case <-deadline:
				t.Fatal("no idle")
			}
		}
	}
	if got := turn(); got != "42" {
		t.Fatalf("result %q", got)
	}
	if got := turn(); got != "42" {
		t.Fatalf("second result %q", got)
	}
	mu.Lock()
	if refreshes != 1 {
		t.Fatalf("%d refreshes, want 1", refreshes)
	}
	mu.Unlock()
	resp, err := c.Get(credPath + "/" + cred["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"at-old", "at-new", "rt-old", "rt-new", "cs-secret"} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Fatalf("the credential shows a secret: %s", raw)
		}
	}
	exp, err := time.Parse(time.RFC3339Nano, got["auth"].(map[string]any)["expires_at"].(string))
	if err != nil || time.Until(exp) < 50*time.Minute {
		t.Fatalf("expires_at after the refresh: %v, %v (%s)", exp, err, raw)
	}
	if mcpSrv.Calls("add") != 2 || mcpSrv.Refused() != 0 {
		t.Fatalf("add calls %d, refused %d", mcpSrv.Calls("add"), mcpSrv.Refused())
	}
}
