package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/auth/authtest"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// oidcSetup starts two real OpenID Providers, a shared one whose tokens
// name their tenant in a claim and one that belongs to tenant_b alone, and a
// node that trusts both.
func oidcSetup(t *testing.T) (srv *server.Server, db *pgtest.DB, shared, own *authtest.Provider) {
	t.Helper()
	shared, own = authtest.Start(t), authtest.Start(t)
	db = pgtest.New(t)
	srv = servertest.Start(t, db, server.Config{NodeID: "node-a", OIDCIssuers: []auth.IssuerConfig{
		{Issuer: shared.Issuer, Audience: "corral", TenantClaim: "org", GroupRoles: map[string][]string{"eng": {"developer"}, "ops": {"admin"}}},
		{Issuer: own.Issuer, Audience: "corral-b", Tenant: "tenant_b", Roles: []string{"admin"}},
	}})
	ctx := context.Background()
	for _, id := range []tenant.ID{"tenant_a", "tenant_b"} {
		if _, err := srv.Store().Tenants().Create(ctx, id, string(id)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []authtest.Client{
		{ID: "svc-a", Secret: "s", Audience: []string{"corral"}, Claims: map[string]any{"org": "tenant_a", "groups": []string{"eng"}}},
		{ID: "viewer-a", Secret: "s", Audience: []string{"corral"}, Claims: map[string]any{"org": "tenant_a", "groups": []string{"sales"}}},
		{ID: "wrong-aud", Secret: "s", Audience: []string{"someone-else"}, Claims: map[string]any{"org": "tenant_a", "groups": []string{"eng"}}},
		{ID: "expired", Secret: "s", Audience: []string{"corral"}, Lifetime: -time.Minute, Claims: map[string]any{"org": "tenant_a", "groups": []string{"eng"}}},
		{ID: "no-tenant", Secret: "s", Audience: []string{"corral"}, Claims: map[string]any{"groups": []string{"eng"}}},
		{ID: "ghost", Secret: "s", Audience: []string{"corral"}, Claims: map[string]any{"org": "tenant_ghost", "groups": []string{"eng"}}},
	} {
		shared.AddClient(c)
	}
	own.AddClient(authtest.Client{ID: "svc-b", Secret: "s", Audience: []string{"corral-b"}})
	return srv, db, shared, own
}

func sdkWithToken(srv *server.Server, token string) anthropic.Client {
	return anthropic.NewClient(
		option.WithBaseURL("http://"+srv.HTTPAddr()),
		option.WithAuthToken(token),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second),
	)
}

// send does one request with a bearer credential and returns status and body.
func send(t *testing.T, method, url, bearer, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// resources makes an agent, an environment and a session through the SDK.
func resources(t *testing.T, c anthropic.Client) (agentID, envID, sessionID string) {
	t.Helper()
	ctx := context.Background()
	ag, err := c.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "a", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-test"}})
	if err != nil {
		t.Fatalf("creating an agent: %v", err)
	}
	env, err := c.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "e"})
	if err != nil {
		t.Fatalf("creating an environment: %v", err)
	}
	sess, err := c.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent:         anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)},
		EnvironmentID: env.ID,
	})
	if err != nil {
		t.Fatalf("creating a session: %v", err)
	}
	return ag.ID, env.ID, sess.ID
}

// Two tenants with tokens from real OpenID Providers each work on their own
// resources through the SDK and get 404 on the other's, on every route.
func TestOIDCTenantsAreIsolatedOnEveryRoute(t *testing.T) {
	srv, _, shared, own := oidcSetup(t)
	tokA, tokB := shared.Token(t, "svc-a"), own.Token(t, "svc-b")
	sdkA, sdkB := sdkWithToken(srv, tokA), sdkWithToken(srv, tokB)
	agA, _, _ := resources(t, sdkA)
	agB, envB, sessB := resources(t, sdkB)

	// Each sees only its own agents.
	list, err := sdkA.Beta.Agents.List(context.Background(), anthropic.BetaAgentListParams{})
	if err != nil || len(list.Data) != 1 || list.Data[0].ID != agA {
		t.Fatalf("tenant A lists %+v, %v", list, err)
	}
	if _, err := sdkA.Beta.Agents.Get(context.Background(), agB, anthropic.BetaAgentGetParams{}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("tenant A read B's agent through the SDK: %v", err)
	}

	base := "http://" + srv.HTTPAddr()
	vaultB, err := sdkB.Beta.Vaults.New(context.Background(), anthropic.BetaVaultNewParams{DisplayName: "b"})
	if err != nil {
		t.Fatal(err)
	}
	credB, err := sdkB.Beta.Vaults.Credentials.New(context.Background(), vaultB.ID, anthropic.BetaVaultCredentialNewParams{
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfStaticBearer: &anthropic.BetaManagedAgentsStaticBearerCreateParams{Token: "t", MCPServerURL: "https://m.example/mcp"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fileB, err := sdkB.Beta.Files.Upload(context.Background(), anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader("b,1\n"), "b.csv", "text/csv")})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := sdkA.Beta.Files.List(context.Background(), anthropic.BetaFileListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("tenant A lists files %+v, %v", l, err)
	}
	resB, err := sdkB.Beta.Sessions.Resources.Add(context.Background(), sessB, anthropic.BetaSessionResourceAddParams{
		BetaManagedAgentsFileResourceParams: anthropic.BetaManagedAgentsFileResourceParams{FileID: fileB.ID},
	})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := sdkA.Beta.Files.List(context.Background(), anthropic.BetaFileListParams{ScopeID: anthropic.String(sessB)}); err != nil || len(l.Data) != 0 {
		t.Fatalf("tenant A lists the outputs of B's session %+v, %v", l, err)
	}
	storeB, err := sdkB.Beta.MemoryStores.New(context.Background(), anthropic.BetaMemoryStoreNewParams{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	memB, err := sdkB.Beta.MemoryStores.Memories.New(context.Background(), storeB.ID, anthropic.BetaMemoryStoreMemoryNewParams{Path: "/b.md", Content: anthropic.String("b")})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := sdkA.Beta.MemoryStores.List(context.Background(), anthropic.BetaMemoryStoreListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("tenant A lists memory stores %+v, %v", l, err)
	}
	skillB, err := sdkB.Beta.Skills.New(context.Background(), anthropic.BetaSkillNewParams{Files: []io.Reader{
		anthropic.File(strings.NewReader("---\nname: b-skill\ndescription: B's.\n---\n"), "b-skill/SKILL.md", "text/markdown")}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := sdkA.Beta.Skills.List(context.Background(), anthropic.BetaSkillListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("tenant A lists skills %+v, %v", l, err)
	}
	bodies := map[string]string{
		"POST /v1/memory_stores/{id}/memories":             `{"path":"/a.md","content":"a"}`,
		"POST /v1/memory_stores/{id}/memories/{memory_id}": `{"content":"a"}`,
		"POST /v1/sessions/{session_id}/events":            `{"events":[{"type":"user.message","content":[{"type":"text","text":"hi"}]}]}`,
		"POST /v1/vaults/{id}/credentials":                 `{"auth":{"type":"static_bearer","token":"t","mcp_server_url":"https://other.example/mcp"}}`,
		"POST /v1/sessions/{session_id}/resources":         `{"type":"file","file_id":"` + fileB.ID + `"}`,
	}
	checked := 0
	for pattern := range publicapi.Rules {
		method, path, _ := strings.Cut(pattern, " ")
		if !strings.Contains(path, "{") {
			continue // lists and creates name no resource; lists are checked above
		}
		id := sessB
		switch {
		case strings.HasPrefix(path, "/v1/agents/"):
			id = agB
		case strings.HasPrefix(path, "/v1/environments/"):
			id = envB
		case strings.HasPrefix(path, "/v1/vaults/"):
			id = vaultB.ID
		case strings.HasPrefix(path, "/v1/files/"):
			id = fileB.ID
		case strings.HasPrefix(path, "/v1/memory_stores/"):
			id = storeB.ID
		case strings.HasPrefix(path, "/v1/skills/"):
			id = skillB.ID
		}
		path = strings.NewReplacer("{id}", id, "{session_id}", id, "{credential_id}", credB.ID, "{resource_id}", resB.ID,
			"{memory_id}", memB.ID, "{version_id}", memB.MemoryVersionID, "{version}", skillB.LatestVersionID).Replace(path)
		body := bodies[pattern]
		if body == "" && method == "POST" {
			body = `{}`
		}
		code, resp := send(t, method, base+path, tokA, body)
		if code != 404 || !strings.Contains(resp, "not_found_error") {
			t.Errorf("%s on tenant B's resource as tenant A: %d %s", pattern, code, resp)
		}
		checked++
	}
	if checked < 18 {
		t.Fatalf("only %d routes name a resource", checked)
	}
	// And B still has everything.
	if _, err := sdkB.Beta.Sessions.Get(context.Background(), sessB, anthropic.BetaSessionGetParams{}); err != nil {
		t.Fatalf("tenant B lost its session: %v", err)
	}
	if _, err := sdkB.Beta.Skills.Versions.Get(context.Background(), skillB.LatestVersionID, anthropic.BetaSkillVersionGetParams{SkillID: skillB.ID}); err != nil {
		t.Fatalf("tenant B lost its skill: %v", err)
	}
	if _, err := sdkB.Beta.Files.GetMetadata(context.Background(), fileB.ID, anthropic.BetaFileGetMetadataParams{}); err != nil {
		t.Fatalf("tenant B lost its file: %v", err)
	}
	if _, err := sdkB.Beta.Sessions.Resources.Get(context.Background(), resB.ID, anthropic.BetaSessionResourceGetParams{SessionID: sessB}); err != nil {
		t.Fatalf("tenant B lost its session's resource: %v", err)
	}
	if m, err := sdkB.Beta.MemoryStores.Memories.Get(context.Background(), memB.ID, anthropic.BetaMemoryStoreMemoryGetParams{MemoryStoreID: storeB.ID}); err != nil || m.Content != "b" {
		t.Fatalf("tenant B lost its memory: %+v, %v", m, err)
	}
}

// Tokens with the wrong audience, expired, signed by a key the provider
// does not publish, of a tenant that does not exist or naming none, and a
// revoked API key are refused with 401; a token whose groups map to no role
// is refused with 403; a rotated signing key is picked up.
func TestOIDCAndKeyRefusals(t *testing.T) {
	srv, db, shared, _ := oidcSetup(t)
	url := "http://" + srv.HTTPAddr() + "/v1/agents"
	for _, client := range []string{"wrong-aud", "expired", "no-tenant", "ghost"} {
		code, body := send(t, "GET", url, shared.Token(t, client), "")
		if code != 401 || !strings.Contains(body, "authentication_error") {
			t.Errorf("%s: %d %s", client, code, body)
		}
		t.Logf("%s: %d %s", client, code, body)
	}
	shared.SignWithUnpublishedKey(t, true)
	forged := shared.Token(t, "svc-a")
	shared.SignWithUnpublishedKey(t, false)
	if code, body := send(t, "GET", url, forged, ""); code != 401 {
		t.Errorf("token signed by an unknown key: %d %s", code, body)
	} else {
		t.Logf("forged: %d %s", code, body)
	}
	if code, body := send(t, "GET", url, shared.Token(t, "viewer-a"), ""); code != 403 || !strings.Contains(body, "permission_error") {
		t.Errorf("token without a role: %d %s", code, body)
	}
	if code, body := send(t, "GET", url, shared.Token(t, "svc-a"), ""); code != 200 {
		t.Fatalf("good token: %d %s", code, body)
	}
	shared.RotateKey(t)
	if code, body := send(t, "GET", url, shared.Token(t, "svc-a"), ""); code != 200 {
		t.Fatalf("token signed with the rotated key: %d %s", code, body)
	}

	// An API key issued and then revoked through the admin API.
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	ctx := context.Background()
	k, err := admin.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{TenantId: "tenant_a", Name: "ci", Roles: []string{"developer"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(k.Secret, "sk-corral-") || !strings.HasPrefix(k.Secret, k.ApiKey.Prefix) {
		t.Fatalf("key %+v", k.ApiKey)
	}
	if code, body := send(t, "GET", url, k.Secret, ""); code != 200 {
		t.Fatalf("new key: %d %s", code, body)
	}
	if _, err := admin.RevokeAPIKey(ctx, &adminv1.RevokeAPIKeyRequest{TenantId: "tenant_a", KeyId: k.ApiKey.Id}); err != nil {
		t.Fatal(err)
	}
	if code, body := send(t, "GET", url, k.Secret, ""); code != 401 || !strings.Contains(body, "revoked") {
		t.Errorf("revoked key: %d %s", code, body)
	}
	keys, err := admin.ListAPIKeys(ctx, &adminv1.ListAPIKeysRequest{TenantId: "tenant_a"})
	if err != nil || len(keys.ApiKeys) != 1 || keys.ApiKeys[0].RevokedAt == nil || keys.ApiKeys[0].LastUsedAt == nil {
		t.Fatalf("keys after revoke: %+v, %v", keys, err)
	}
	if strings.Contains(keys.String(), k.Secret) {
		t.Fatal("a listing carries the secret")
	}
}
