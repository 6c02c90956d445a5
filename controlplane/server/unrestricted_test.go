package server_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
)

// grantPolicy is the repository's policy with quotas.yaml's
// unrestricted_networking set to grant (a YAML list of tenant ids).
func grantPolicy(t *testing.T, grant string) string {
	t.Helper()
	runtimes, err := os.ReadFile(filepath.Join("..", "..", "policy", "runtimes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := policyDir(t, string(runtimes))
	q := filepath.Join(dir, "quotas.yaml")
	b, err := os.ReadFile(q)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "unrestricted_networking: []", "unrestricted_networking: "+grant, 1)
	if s == string(b) {
		t.Fatal("quotas.yaml has no unrestricted_networking: [] to replace")
	}
	if err := os.WriteFile(q, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestUnrestrictedNetworkingByGrant, through the SDK: a tenant without the
// policy's grant is refused an unrestricted environment (400 naming the
// grant); one with it gets it, reported as stored, and starts sessions on
// it. A node whose policy no longer grants it (the grant withdrawn) still
// reports the environment as it is, refuses a new session on it with a
// 409 that says why, and lets the tenant change it to limited networking.
func TestUnrestrictedNetworkingByGrant(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", PolicyDir: grantPolicy(t, "[tenant_open]")})
	ctx := context.Background()
	unrestricted := anthropic.BetaEnvironmentNewParams{Name: "open", Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
		Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfUnrestricted: &anthropic.BetaUnrestrictedNetworkParam{}}}}}
	status := func(err error) int {
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) {
			return 0
		}
		return apiErr.StatusCode
	}

	closed := sdkWithKey(srv.HTTPAddr(), servertest.TenantKey(t, srv, "tenant_closed"))
	_, err := closed.Beta.Environments.New(ctx, unrestricted)
	if status(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "unrestricted_networking") {
		t.Fatalf("an unrestricted environment without the grant: %v", err)
	}

	openKey := servertest.TenantKey(t, srv, "tenant_open")
	open := sdkWithKey(srv.HTTPAddr(), openKey)
	env, err := open.Beta.Environments.New(ctx, unrestricted)
	if err != nil {
		t.Fatalf("an unrestricted environment with the grant: %v", err)
	}
	if n := env.Config.Networking; n.Type != "unrestricted" || len(n.AllowedHosts) != 0 {
		t.Fatalf("networking reported: %s", n.RawJSON())
	}
	ag, err := open.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "a", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	newSession := func(c anthropic.Client) error {
		_, err := c.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID,
		})
		return err
	}
	if err := newSession(open); err != nil {
		t.Fatalf("a session on the unrestricted environment: %v", err)
	}

	// A node of the same database whose policy grants it to no tenant.
	withdrawn := servertest.Start(t, db, server.Config{NodeID: "node-b"})
	later := sdkWithKey(withdrawn.HTTPAddr(), openKey)
	if got, err := later.Beta.Environments.Get(ctx, env.ID, anthropic.BetaEnvironmentGetParams{}); err != nil || got.Config.Networking.Type != "unrestricted" {
		t.Fatalf("the environment after the grant is withdrawn: %+v, %v", got, err)
	}
	if err := newSession(later); status(err) != http.StatusConflict || !strings.Contains(err.Error(), "no longer grants") {
		t.Fatalf("a new session after the grant is withdrawn: %v", err)
	}
	if _, err := later.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "open-2", Config: unrestricted.Config}); status(err) != http.StatusBadRequest {
		t.Fatalf("a new unrestricted environment after the grant is withdrawn: %v", err)
	}
	lim, err := later.Beta.Environments.Update(ctx, env.ID, anthropic.BetaEnvironmentUpdateParams{Config: anthropic.BetaEnvironmentUpdateParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
		Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfLimited: &anthropic.BetaLimitedNetworkParams{AllowedHosts: []string{"example.com"}}}}}})
	if err != nil || lim.Config.Networking.Type != "limited" {
		t.Fatalf("changing it to limited: %+v, %v", lim, err)
	}
	if err := newSession(later); err != nil {
		t.Fatalf("a session once it is limited: %v", err)
	}
}
