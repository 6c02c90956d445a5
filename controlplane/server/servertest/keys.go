package servertest

import (
	"context"
	"testing"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// TenantKey issues a key of tenant id (created if missing) with roles
// (default admin) and returns its secret.
func TenantKey(t testing.TB, srv *server.Server, id tenant.ID, roles ...string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := srv.Store().Tenants().Get(ctx, id); err != nil {
		if _, err := srv.Store().Tenants().Create(ctx, id, string(id)); err != nil {
			t.Fatalf("creating tenant %s: %v", id, err)
		}
	}
	_, secret, err := srv.Store().APIKeys().Issue(tenant.With(ctx, id), store.NewAPIKey{Name: "test", Roles: roles})
	if err != nil {
		t.Fatalf("issuing a key for %s: %v", id, err)
	}
	return secret.Reveal()
}

// OperatorKey issues a fleet key with roles (default operator) as the owner
// of db and returns its secret.
func OperatorKey(t testing.TB, db *pgtest.DB, roles ...string) string {
	t.Helper()
	if len(roles) == 0 {
		roles = []string{"operator"}
	}
	_, secret, err := store.BootstrapOperatorKey(context.Background(), db.OwnerURL, "test", roles)
	if err != nil {
		t.Fatalf("issuing an operator key: %v", err)
	}
	return secret.Reveal()
}
