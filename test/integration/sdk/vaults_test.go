package sdk

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// Vaults and credentials through the official SDK (Beta.Vaults and
// Beta.Vaults.Credentials): every response decodes cleanly, the token is
// never in one, and a session names the vault.
func TestVaultsThroughTheSDK(t *testing.T) {
	client := setup(t)
	ctx := context.Background()
	const token = "sdk-token-0b5e-secret"

	vault, err := client.Beta.Vaults.New(ctx, anthropic.BetaVaultNewParams{DisplayName: "Production", Metadata: map[string]string{"team": "sdk"}})
	if err != nil {
		t.Fatalf("Vaults.New: %v", err)
	}
	decodedCleanly(t, "Vaults.New", vault)
	if !strings.HasPrefix(vault.ID, "vlt_") || vault.Type != "vault" || vault.DisplayName != "Production" || vault.Metadata["team"] != "sdk" ||
		vault.JSON.ArchivedAt.Raw() != "null" || vault.CreatedAt.IsZero() {
		t.Fatalf("vault = %s", vault.RawJSON())
	}
	cred, err := client.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
		DisplayName: anthropic.String("docs"),
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfStaticBearer: &anthropic.BetaManagedAgentsStaticBearerCreateParams{
			Token: token, MCPServerURL: "https://mcp.example.com/mcp",
		}},
	})
	if err != nil {
		t.Fatalf("Credentials.New: %v", err)
	}
	decodedCleanly(t, "Credentials.New", cred)
	if !strings.HasPrefix(cred.ID, "vcrd_") || cred.Type != "vault_credential" || cred.VaultID != vault.ID || cred.DisplayName != "docs" ||
		cred.Auth.Type != "static_bearer" || cred.Auth.MCPServerURL != "https://mcp.example.com/mcp" || strings.Contains(cred.RawJSON(), token) {
		t.Fatalf("credential = %s", cred.RawJSON())
	}
	if sb := cred.Auth.AsStaticBearer(); sb.MCPServerURL != "https://mcp.example.com/mcp" {
		t.Fatalf("auth as static_bearer = %+v", sb)
	}
	upd, err := client.Beta.Vaults.Credentials.Update(ctx, cred.ID, anthropic.BetaVaultCredentialUpdateParams{
		VaultID:  vault.ID,
		Metadata: map[string]string{"rotated": "yes"},
		Auth: anthropic.BetaVaultCredentialUpdateParamsAuthUnion{OfStaticBearer: &anthropic.BetaManagedAgentsStaticBearerUpdateParams{
			Token: anthropic.String(token + "-2"),
		}},
	})
	if err != nil || upd.Metadata["rotated"] != "yes" || strings.Contains(upd.RawJSON(), token) {
		t.Fatalf("Credentials.Update: %v", err)
	}
	decodedCleanly(t, "Credentials.Update", upd)
	got, err := client.Beta.Vaults.Credentials.Get(ctx, cred.ID, anthropic.BetaVaultCredentialGetParams{VaultID: vault.ID})
	if err != nil || got.ID != cred.ID {
		t.Fatalf("Credentials.Get: %v", err)
	}
	decodedCleanly(t, "Credentials.Get", got)
	creds := client.Beta.Vaults.Credentials.ListAutoPaging(ctx, vault.ID, anthropic.BetaVaultCredentialListParams{})
	n := 0
	for creds.Next() {
		decodedCleanly(t, "Credentials.List", creds.Current())
		n++
	}
	if creds.Err() != nil || n != 1 {
		t.Fatalf("listed %d credentials, %v", n, creds.Err())
	}

	// mcp_oauth with a refresh configuration: decoded cleanly, no secret.
	oauth, err := client.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfMCPOAuth: &anthropic.BetaManagedAgentsMCPOAuthCreateParams{
			AccessToken: "sdk-at-secret", MCPServerURL: "https://oauth.example.com/mcp", ExpiresAt: anthropic.Time(time.Now().Add(time.Hour)),
			Refresh: anthropic.BetaManagedAgentsMCPOAuthRefreshParams{
				ClientID: "cid", RefreshToken: "sdk-rt-secret", TokenEndpoint: "https://auth.example.com/token", Scope: anthropic.String("tools"),
				TokenEndpointAuth: anthropic.BetaManagedAgentsMCPOAuthRefreshParamsTokenEndpointAuthUnion{
					OfClientSecretPost: &anthropic.BetaManagedAgentsTokenEndpointAuthPostParam{ClientSecret: "sdk-cs-secret"},
				},
			},
		}},
	})
	if err != nil {
		t.Fatalf("Credentials.New mcp_oauth: %v", err)
	}
	decodedCleanly(t, "Credentials.New mcp_oauth", oauth)
	if o := oauth.Auth.AsMCPOAuth(); o.MCPServerURL != "https://oauth.example.com/mcp" || o.ExpiresAt.IsZero() || o.Refresh.ClientID != "cid" ||
		o.Refresh.TokenEndpointAuth.Type != "client_secret_post" || o.Refresh.Scope != "tools" || strings.Contains(oauth.RawJSON(), "sdk-") {
		t.Fatalf("mcp_oauth credential = %s", oauth.RawJSON())
	}
	if _, err := client.Beta.Vaults.Credentials.Archive(ctx, oauth.ID, anthropic.BetaVaultCredentialArchiveParams{VaultID: vault.ID}); err != nil {
		t.Fatalf("Credentials.Archive: %v", err)
	}

	// environment_variable with unrestricted networking is refused: the
	// egress proxy substitutes a secret only toward the hosts it lists.
	_, err = client.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfEnvironmentVariable: &anthropic.BetaManagedAgentsEnvironmentVariableCreateParams{
			SecretName: "API_KEY", SecretValue: "v",
			Networking: anthropic.BetaManagedAgentsCredentialNetworkingParamsUnion{OfUnrestricted: &anthropic.BetaManagedAgentsUnrestrictedCredentialNetworkingParams{}},
		}},
	})
	if e := apiError(t, err, 400); !strings.Contains(e.Error(), "networking unrestricted is not supported") {
		t.Fatalf("environment_variable: %v", e)
	}

	// A session names the vault.
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "a", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "claude-sonnet-4-6"}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "e"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent:         anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)},
		EnvironmentID: env.ID,
		VaultIDs:      []string{vault.ID},
	})
	if err != nil {
		t.Fatalf("Sessions.New with vault_ids: %v", err)
	}
	if len(s.VaultIDs) != 1 || s.VaultIDs[0] != vault.ID {
		t.Fatalf("session vault_ids = %v", s.VaultIDs)
	}

	vaults := client.Beta.Vaults.ListAutoPaging(ctx, anthropic.BetaVaultListParams{Limit: anthropic.Int(1)})
	n = 0
	for vaults.Next() {
		decodedCleanly(t, "Vaults.List", vaults.Current())
		n++
	}
	if vaults.Err() != nil || n != 1 {
		t.Fatalf("listed %d vaults, %v", n, vaults.Err())
	}
	archived, err := client.Beta.Vaults.Archive(ctx, vault.ID, anthropic.BetaVaultArchiveParams{})
	if err != nil || archived.ArchivedAt.IsZero() {
		t.Fatalf("Vaults.Archive: %v", err)
	}
	decodedCleanly(t, "Vaults.Archive", archived)
	_, err = client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent:         anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)},
		EnvironmentID: env.ID,
		VaultIDs:      []string{vault.ID},
	})
	apiError(t, err, 400)
	if _, err := client.Beta.Vaults.Credentials.Delete(ctx, cred.ID, anthropic.BetaVaultCredentialDeleteParams{VaultID: vault.ID}); err != nil {
		t.Fatalf("Credentials.Delete: %v", err)
	}
	del, err := client.Beta.Vaults.Delete(ctx, vault.ID, anthropic.BetaVaultDeleteParams{})
	if err != nil || del.ID != vault.ID || del.Type != "vault_deleted" {
		t.Fatalf("Vaults.Delete: %+v, %v", del, err)
	}
}

// environment_variable credentials through the SDK: created, updated,
// read and listed as the SDK has them, decoded cleanly, the secret never
// in a response; what corral does not enforce (a body injection) is a
// 400.
func TestEnvironmentVariableCredentialsThroughTheSDK(t *testing.T) {
	client := setup(t)
	ctx := context.Background()
	const secret = "sdk-env-secret-7c2d"
	vault, err := client.Beta.Vaults.New(ctx, anthropic.BetaVaultNewParams{DisplayName: "env"})
	if err != nil {
		t.Fatal(err)
	}
	cred, err := client.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfEnvironmentVariable: &anthropic.BetaManagedAgentsEnvironmentVariableCreateParams{
			SecretName: "API_TOKEN", SecretValue: secret,
			Networking: anthropic.BetaManagedAgentsCredentialNetworkingParamsUnion{OfLimited: &anthropic.BetaManagedAgentsLimitedCredentialNetworkingParams{
				AllowedHosts: []string{"api.example.com", "*.example.org"},
			}},
			InjectionLocation: anthropic.BetaManagedAgentsInjectionLocationParams{Header: anthropic.Bool(true)},
		}},
	})
	if err != nil {
		t.Fatalf("Credentials.New: %v", err)
	}
	decodedCleanly(t, "Credentials.New", cred)
	ev := cred.Auth.AsEnvironmentVariable()
	if ev.SecretName != "API_TOKEN" || ev.Networking.Type != "limited" || strings.Join(ev.Networking.AsLimited().AllowedHosts, ",") != "api.example.com,*.example.org" ||
		!ev.InjectionLocation.Header || ev.InjectionLocation.Body || strings.Contains(cred.RawJSON(), secret) {
		t.Fatalf("credential = %s", cred.RawJSON())
	}
	upd, err := client.Beta.Vaults.Credentials.Update(ctx, cred.ID, anthropic.BetaVaultCredentialUpdateParams{
		VaultID: vault.ID,
		Auth: anthropic.BetaVaultCredentialUpdateParamsAuthUnion{OfEnvironmentVariable: &anthropic.BetaManagedAgentsEnvironmentVariableUpdateParams{
			SecretValue: anthropic.String(secret + "-2"),
			Networking: anthropic.BetaManagedAgentsCredentialNetworkingParamsUnion{OfLimited: &anthropic.BetaManagedAgentsLimitedCredentialNetworkingParams{
				AllowedHosts: []string{"new.example.com"},
			}},
		}},
	})
	if err != nil || strings.Contains(upd.RawJSON(), secret) {
		t.Fatalf("Credentials.Update: %v", err)
	}
	decodedCleanly(t, "Credentials.Update", upd)
	if hosts := upd.Auth.AsEnvironmentVariable().Networking.AsLimited().AllowedHosts; len(hosts) != 1 || hosts[0] != "new.example.com" {
		t.Fatalf("updated hosts = %v", hosts)
	}
	got, err := client.Beta.Vaults.Credentials.Get(ctx, cred.ID, anthropic.BetaVaultCredentialGetParams{VaultID: vault.ID})
	if err != nil || got.Auth.AsEnvironmentVariable().SecretName != "API_TOKEN" {
		t.Fatalf("Credentials.Get: %v", err)
	}
	decodedCleanly(t, "Credentials.Get", got)
	creds := client.Beta.Vaults.Credentials.ListAutoPaging(ctx, vault.ID, anthropic.BetaVaultCredentialListParams{})
	for creds.Next() {
		decodedCleanly(t, "Credentials.List", creds.Current())
	}
	_, err = client.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfEnvironmentVariable: &anthropic.BetaManagedAgentsEnvironmentVariableCreateParams{
			SecretName: "BODY_TOKEN", SecretValue: secret,
			Networking:        anthropic.BetaManagedAgentsCredentialNetworkingParamsUnion{OfLimited: &anthropic.BetaManagedAgentsLimitedCredentialNetworkingParams{AllowedHosts: []string{"x.example"}}},
			InjectionLocation: anthropic.BetaManagedAgentsInjectionLocationParams{Body: anthropic.Bool(true)},
		}},
	})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || strings.Contains(err.Error(), secret) {
		t.Fatalf("a body injection: %v", err)
	}
}

// A session with an environment_variable credential whose environment
// allows no network, in a gVisor sandbox through the SDK: nothing could
// carry the secret, so the variable is not set, and the tool result says
// why instead of leaving it silently absent.
func TestCredentialWithoutEgressIsTold(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-cred-noegress", SandboxRuntime: admission.RuntimeGVisor})
	startGVisorHost(t, srv, "gvisor-cred-noegress")
	a := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	vault, err := a.Beta.Vaults.New(ctx, anthropic.BetaVaultNewParams{DisplayName: "no egress"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
		Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfEnvironmentVariable: &anthropic.BetaManagedAgentsEnvironmentVariableCreateParams{
			SecretName: "API_TOKEN", SecretValue: "never-in-the-sandbox-5e1f",
			Networking: anthropic.BetaManagedAgentsCredentialNetworkingParamsUnion{OfLimited: &anthropic.BetaManagedAgentsLimitedCredentialNetworkingParams{
				AllowedHosts: []string{"api.example.com"},
			}},
			InjectionLocation: anthropic.BetaManagedAgentsInjectionLocationParams{Header: anthropic.Bool(true)},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	ag, err := a.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name: "cred", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	env, err := a.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "closed"}) // no networking: none
	if err != nil {
		t.Fatal(err)
	}
	sess, err := a.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID, VaultIDs: []string{vault.ID},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := a.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	out := bashTurn(t, ctx, a, sess.ID, s, "echo token=${API_TOKEN-unset}")
	if !strings.Contains(out, "token=unset") || !strings.Contains(out, "API_TOKEN") || !strings.Contains(out, "not available") || strings.Contains(out, "never-in-the-sandbox") {
		t.Fatalf("the tool result: %q", out)
	}
}
