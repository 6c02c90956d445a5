package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/auth/authtest"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

func principalIn(ps []*adminv1.Principal, id string) *adminv1.Principal {
	for _, p := range ps {
		if p.Id == id {
			return p
		}
	}
	return nil
}

// A tenant's admin manages its service principals through the admin API:
// keys of a principal carry its roles, follow a grant at once, and are
// refused while it is disabled. Another tenant's admin cannot see or touch
// them; a developer cannot manage principals; an operator can.
func TestServicePrincipalsThroughTheAdminAPI(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	ctx := context.Background()
	agents := "http://" + srv.HTTPAddr() + "/v1/agents"
	adminA := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.TenantKey(t, srv, "tenant_a")))
	adminB := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.TenantKey(t, srv, "tenant_b")))
	devA := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.TenantKey(t, srv, "tenant_a", "developer")))
	op := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))

	if _, err := adminA.CreatePrincipal(ctx, &adminv1.CreatePrincipalRequest{Kind: "service", Name: "ci", Roles: []string{"operator"}}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
		t.Fatalf("a fleet role for a tenant principal: %v", err)
	}
	created, err := adminA.CreatePrincipal(ctx, &adminv1.CreatePrincipalRequest{Kind: "service", Name: "ci", Roles: []string{"developer"}})
	if err != nil {
		t.Fatal(err)
	}
	ci := created.Principal
	key1, err := adminA.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{Name: "ci-1", PrincipalId: ci.Id})
	if err != nil {
		t.Fatal(err)
	}
	key2, err := adminA.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{Name: "ci-2", PrincipalId: ci.Id})
	if err != nil {
		t.Fatal(err)
	}
	if key1.ApiKey.PrincipalId != ci.Id || !slices.Equal(key1.ApiKey.Roles, []string{"developer"}) {
		t.Fatalf("key %+v", key1.ApiKey)
	}
	both := []string{key1.Secret, key2.Secret}
	expect := func(what string, write, read int) {
		t.Helper()
		for _, k := range both {
			if code, body := send(t, "POST", agents, k, `{"name":"a","model":"m"}`); code != write {
				t.Fatalf("%s: write %d %s, want %d", what, code, body, write)
			}
			if code, body := send(t, "GET", agents, k, ""); code != read {
				t.Fatalf("%s: read %d %s, want %d", what, code, body, read)
			}
		}
	}
	expect("developer", 200, 200)
	if _, err := adminA.SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{PrincipalId: ci.Id, Roles: []string{"viewer"}}); err != nil {
		t.Fatal(err)
	}
	expect("viewer", 403, 200)
	if _, err := adminA.DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{PrincipalId: ci.Id}); err != nil {
		t.Fatal(err)
	}
	expect("disabled", 401, 401)
	if _, err := adminA.EnablePrincipal(ctx, &adminv1.EnablePrincipalRequest{PrincipalId: ci.Id}); err != nil {
		t.Fatal(err)
	}
	expect("enabled", 403, 200)
	if keys, err := adminA.ListAPIKeys(ctx, &adminv1.ListAPIKeysRequest{PrincipalId: ci.Id}); err != nil || len(keys.ApiKeys) != 2 {
		t.Fatalf("the principal's keys: %v, %v", keys, err)
	}

	// The admin's own key has a principal too, which cannot disable itself.
	list, err := adminA.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if principalIn(list.Principals, ci.Id) == nil || len(list.Principals) != 3 { // ci, the admin key's and the developer key's
		t.Fatalf("tenant_a's principals: %v", list.Principals)
	}
	for _, p := range list.Principals {
		if p.Id == ci.Id || !slices.Contains(p.Roles, "admin") {
			continue
		}
		if _, err := adminA.DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{PrincipalId: p.Id}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.FailedPreconditionKind {
			t.Fatalf("disabling oneself: %v", err)
		}
	}

	// Tenant b's admin: the principal does not exist for it, whatever tenant it names.
	if _, err := adminB.GetPrincipal(ctx, &adminv1.GetPrincipalRequest{TenantId: "tenant_a", PrincipalId: ci.Id}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.NotFoundKind {
		t.Fatalf("tenant_b reading tenant_a's principal: %v", err)
	}
	for name, call := range map[string]func() error{
		"grant": func() error {
			_, err := adminB.SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{PrincipalId: ci.Id, Roles: []string{"admin"}})
			return err
		},
		"disable": func() error {
			_, err := adminB.DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{PrincipalId: ci.Id})
			return err
		},
		"key": func() error {
			_, err := adminB.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{Name: "x", PrincipalId: ci.Id})
			return err
		},
	} {
		if err := call(); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.NotFoundKind {
			t.Fatalf("tenant_b's %s on tenant_a's principal: %v", name, err)
		}
	}
	if _, err := adminB.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{TenantId: "tenant_a"}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.NotFoundKind {
		t.Fatalf("tenant_b listing tenant_a's principals: %v", err)
	}
	if lb, err := adminB.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{}); err != nil || principalIn(lb.Principals, ci.Id) != nil || len(lb.Principals) != 1 {
		t.Fatalf("tenant_b's list: %v, %v", lb, err)
	}
	expect("after tenant_b's attempts", 403, 200)

	// A developer cannot manage principals; an operator can, for any tenant.
	if _, err := devA.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.PermissionDeniedKind {
		t.Fatalf("developer listing principals: %v", err)
	}
	got, err := op.GetPrincipal(ctx, &adminv1.GetPrincipalRequest{TenantId: "tenant_a", PrincipalId: ci.Id})
	if err != nil || got.Principal.Name != "ci" || !slices.Equal(got.Principal.Roles, []string{"viewer"}) {
		t.Fatalf("operator reading: %v, %v", got, err)
	}
	if _, err := op.DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{TenantId: "tenant_a", PrincipalId: ci.Id}); err != nil {
		t.Fatal(err)
	}
	expect("disabled by an operator", 401, 401)
	if _, err := op.GetPrincipal(ctx, &adminv1.GetPrincipalRequest{TenantId: "tenant_b", PrincipalId: ci.Id}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.NotFoundKind {
		t.Fatalf("operator naming the wrong tenant: %v", err)
	}
}

// An OIDC subject becomes a user record on its first token. Its roles are
// its groups' and those granted to it; disabling it refuses its tokens. A
// user made ahead of its first token holds its roles from the start.
func TestOIDCUsersAreRecords(t *testing.T) {
	srv, db, shared, _ := oidcSetup(t)
	ctx := context.Background()
	agents := "http://" + srv.HTTPAddr() + "/v1/agents"
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.TenantKey(t, srv, "tenant_a")))
	op := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	tok := shared.Token(t, "viewer-a") // its group maps to no role

	if code, _ := send(t, "GET", agents, tok, ""); code != 403 {
		t.Fatalf("a token with no role: %d, want 403", code)
	}
	list, err := admin.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var user *adminv1.Principal
	for _, p := range list.Principals {
		if p.Kind == "user" && p.Subject == "viewer-a" {
			user = p
		}
	}
	if user == nil || user.Issuer != shared.Issuer || user.LastSeenAt == nil || len(user.Roles) != 0 {
		t.Fatalf("no user record after the first token: %v", list.Principals)
	}
	if _, err := admin.SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{PrincipalId: user.Id, Roles: []string{"developer"}}); err != nil {
		t.Fatal(err)
	}
	if code, body := send(t, "POST", agents, tok, `{"name":"a","model":"m"}`); code != 200 {
		t.Fatalf("after the grant: %d %s", code, body)
	}
	if _, err := admin.DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{PrincipalId: user.Id}); err != nil {
		t.Fatal(err)
	}
	if code, body := send(t, "GET", agents, tok, ""); code != 401 || !strings.Contains(body, "disabled") {
		t.Fatalf("a disabled user's token: %d %s", code, body)
	}
	// The same subject of another tenant is another user, unaffected.
	if _, err := srv.Store().Principals().SeenUser(tenant.With(ctx, "tenant_b"), shared.Issuer, "viewer-a", ""); err != nil {
		t.Fatal(err)
	}
	if lb, err := op.ListPrincipals(ctx, &adminv1.ListPrincipalsRequest{TenantId: "tenant_b"}); err != nil || principalIn(lb.Principals, user.Id) != nil {
		t.Fatalf("tenant_b's principals: %v, %v", lb, err)
	}

	// A user made ahead, with roles, before its first token.
	if _, err := admin.CreatePrincipal(ctx, &adminv1.CreatePrincipalRequest{Kind: "user", Issuer: "https://unknown.example", Subject: "x"}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
		t.Fatalf("a user of an issuer not trusted: %v", err)
	}
	shared.AddClient(authtest.Client{ID: "late-a", Secret: "s", Audience: []string{"corral"}, Claims: map[string]any{"org": "tenant_a", "groups": []string{"sales"}}})
	pre, err := admin.CreatePrincipal(ctx, &adminv1.CreatePrincipalRequest{Kind: "user", Issuer: shared.Issuer, Subject: "late-a", Roles: []string{"viewer"}})
	if err != nil {
		t.Fatal(err)
	}
	late := shared.Token(t, "late-a")
	if code, body := send(t, "GET", agents, late, ""); code != 200 {
		t.Fatalf("a user granted viewer ahead: read %d %s", code, body)
	}
	if code, _ := send(t, "POST", agents, late, `{"name":"b","model":"m"}`); code != 403 {
		t.Fatalf("a viewer's write: %d, want 403", code)
	}
	got, err := admin.GetPrincipal(ctx, &adminv1.GetPrincipalRequest{PrincipalId: pre.Principal.Id})
	if err != nil || got.Principal.LastSeenAt == nil {
		t.Fatalf("the user made ahead was not the one seen: %v, %v", got, err)
	}
	if _, err := admin.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{Name: "k", PrincipalId: pre.Principal.Id}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.InvalidArgumentKind {
		t.Fatalf("an API key for a user: %v", err)
	}
}

// An operator lists operator keys and revokes another operator's leaked
// key through the admin API, not its own; tenants and fleet viewers cannot.
func TestOperatorKeysThroughTheAdminAPI(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	ctx := context.Background()
	status := "http://" + srv.HTTPAddr() + "/admin/v1/cluster/status"
	alice, leaked := servertest.OperatorKey(t, db), servertest.OperatorKey(t, db)
	op := adminv1.NewOperatorKeysServiceClient(dial(t, srv.GRPCAddr(), alice))

	list, err := op.ListOperatorKeys(ctx, &adminv1.ListOperatorKeysRequest{})
	if err != nil || len(list.ApiKeys) != 2 {
		t.Fatalf("ListOperatorKeys = %v, %v", list, err)
	}
	var aliceID, leakedID string
	for _, k := range list.ApiKeys {
		if k.TenantId != "" || k.Principal == "" || !strings.HasPrefix(alice, k.Prefix) && !strings.HasPrefix(leaked, k.Prefix) {
			t.Fatalf("operator key %+v", k)
		}
		if strings.HasPrefix(alice, k.Prefix) {
			aliceID = k.Id
		} else {
			leakedID = k.Id
		}
	}
	if code, _ := send(t, "GET", status, leaked, ""); code != 200 {
		t.Fatalf("the second operator key before revocation: %d", code)
	}
	if _, err := op.RevokeOperatorKey(ctx, &adminv1.RevokeOperatorKeyRequest{KeyId: aliceID}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.FailedPreconditionKind {
		t.Fatalf("a key revoking itself: %v", err)
	}
	got, err := op.RevokeOperatorKey(ctx, &adminv1.RevokeOperatorKeyRequest{KeyId: leakedID})
	if err != nil || got.ApiKey.RevokedAt == nil {
		t.Fatalf("RevokeOperatorKey = %v, %v", got, err)
	}
	if code, _ := send(t, "GET", status, leaked, ""); code != 401 {
		t.Fatalf("a revoked operator key: %d, want 401", code)
	}
	if code, _ := send(t, "GET", status, alice, ""); code != 200 {
		t.Fatalf("the revoking operator's own key: %d", code)
	}
	// Over REST too, and refused to a tenant's admin and to a fleet viewer.
	if code, body := send(t, "GET", "http://"+srv.HTTPAddr()+"/admin/v1/operator_keys", alice, ""); code != 200 || !strings.Contains(body, leakedID) {
		t.Fatalf("GET /admin/v1/operator_keys: %d %s", code, body)
	}
	for name, key := range map[string]string{
		"a tenant's admin": servertest.TenantKey(t, srv, tenant.Default),
		"a fleet viewer":   servertest.OperatorKey(t, db, "fleet_viewer"),
	} {
		c := adminv1.NewOperatorKeysServiceClient(dial(t, srv.GRPCAddr(), key))
		if _, err := c.ListOperatorKeys(ctx, &adminv1.ListOperatorKeysRequest{}); errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.PermissionDeniedKind {
			t.Fatalf("%s listing operator keys: %v", name, err)
		}
	}
}
