package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
)

func TestAuthenticateKeys(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	b := tenant.With(ctx, "tenant_b")
	k, secret, err := s.APIKeys().Issue(b, store.NewAPIKey{Name: "ci", Roles: []string{"developer"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret.Reveal(), "sk-corral-") || !strings.HasPrefix(secret.Reveal(), k.Prefix) || strings.Contains(secret.Reveal(), strings.TrimPrefix(k.ID, "key_")) {
		t.Fatalf("secret %q, prefix %q, id %q: want the prefix shown and the id unrelated", secret.Reveal(), k.Prefix, k.ID)
	}
	ki, err := s.APIKeys().Authenticate(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if ki.TenantID != "tenant_b" || ki.KeyID != k.ID || ki.Revoked || ki.Suspended || len(ki.Roles) != 1 || ki.Roles[0] != "developer" || !ki.LastUsedAt.IsZero() {
		t.Fatalf("Authenticate = %+v", ki)
	}
	if _, err := s.APIKeys().Authenticate(ctx, "sk-corral-nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown key: %v", err)
	}

	// Last use is recorded, and at most once a minute.
	if err := s.APIKeys().Touch(ctx, "tenant_b", k.ID); err != nil {
		t.Fatal(err)
	}
	ki, _ = s.APIKeys().Authenticate(ctx, secret)
	first := ki.LastUsedAt
	if first.IsZero() {
		t.Fatal("last use not recorded")
	}
	if err := s.APIKeys().Touch(ctx, "tenant_b", k.ID); err != nil {
		t.Fatal(err)
	}
	if ki, _ = s.APIKeys().Authenticate(ctx, secret); !ki.LastUsedAt.Equal(first) {
		t.Fatalf("a second touch within a minute moved last use from %v to %v", first, ki.LastUsedAt)
	}

	if _, err := s.Tenants().SetStatus(ctx, "tenant_b", store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	if ki, _ = s.APIKeys().Authenticate(ctx, secret); !ki.Suspended {
		t.Fatal("suspension not reported")
	}
	if _, err := s.APIKeys().Revoke(b, k.ID); err != nil {
		t.Fatal(err)
	}
	if ki, _ = s.APIKeys().Authenticate(ctx, secret); !ki.Revoked {
		t.Fatal("revocation not reported")
	}
	// Another tenant cannot revoke b's key.
	if _, err := s.APIKeys().Revoke(tenant.With(ctx, tenant.Default), k.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("revoke across tenants: %v", err)
	}

	// An operator key, inserted by the owner as bootstrap does.
	id, opSecret, hash, prefix := store.NewOperatorKey()
	exec(t, db.OwnerURL, `INSERT INTO operator_keys (id, name, principal, roles, secret_hash, prefix) VALUES ($1, 'root', 'operator:root', '{operator}', $2, $3)`, id, hash, prefix)
	ki, err = s.APIKeys().Authenticate(ctx, opSecret)
	if err != nil || ki.TenantID != "" || ki.Roles[0] != "operator" || ki.Principal != "operator:root" {
		t.Fatalf("operator key: %+v, %v", ki, err)
	}
	// The application role cannot read operator keys directly.
	conn, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM operator_keys`).Scan(&n); err == nil {
		t.Fatal("the application role read operator_keys")
	}
}

func TestTenantsAdmin(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_acme", "Acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tenants().Create(ctx, "tenant_acme", "Acme 2"); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := s.Tenants().Create(ctx, "acme", "x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: %v", err)
	}
	list, err := s.Tenants().List(ctx)
	if err != nil || len(list) != 2 || list[1].ID != "tenant_acme" || list[1].Status != store.TenantActive {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := s.Tenants().Get(ctx, "tenant_nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("Get unknown: %v", err)
	}
	if err := s.Tenants().Delete(ctx, "tenant_nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("Delete unknown: %v", err)
	}
}

func TestQuotaOverrides(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	if o, err := s.Quotas().Get(ctx); err != nil || o.ConcurrentSessions != nil {
		t.Fatalf("no overrides yet: %+v, %v", o, err)
	}
	two, zero := int32(2), int32(0)
	if _, err := s.Quotas().Set(ctx, store.QuotaOverride{ConcurrentSessions: &zero}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("zero limit: %v", err)
	}
	if _, err := s.Quotas().Set(ctx, store.QuotaOverride{ConcurrentSessions: &two}); err != nil {
		t.Fatal(err)
	}
	o, err := s.Quotas().Get(ctx)
	if err != nil || o.ConcurrentSessions == nil || *o.ConcurrentSessions != 2 || o.CPUMillis != nil {
		t.Fatalf("Get = %+v, %v", o, err)
	}
}

// Many concurrent creates against a limit of 3 make exactly 3 sessions.
func TestSessionQuotaIsRaceFree(t *testing.T) {
	s, _, a, _ := setup(t)
	ag, env := agentAndEnv(t, s, a)
	three := int32(3)
	if _, err := s.Quotas().Set(a, store.QuotaOverride{ConcurrentSessions: &three}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, refused := 0, 0
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Sessions().Create(a, store.Session{AgentID: ag.ID, AgentVersion: ag.Version, EnvironmentID: env.ID})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made++
			case errdefs.KindOf(err) == errdefs.ResourceExhaustedKind:
				refused++
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if made != 3 || refused != 9 {
		t.Fatalf("made %d, refused %d; want 3 and 9", made, refused)
	}
}

func TestAuditLog(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	for _, rec := range []store.AuditRecord{
		{TenantID: tenant.Default, Principal: "p1", Action: "agents:write", Resource: "POST /v1/agents", Outcome: "ok", RemoteAddr: "127.0.0.1", RequestID: "req_1"},
		{TenantID: "tenant_b", Principal: "p2", Action: "sessions:write", Resource: "POST /v1/sessions", Outcome: "denied", RemoteAddr: "127.0.0.2", RequestID: "req_2"},
		{Principal: "anonymous", Action: "", Resource: "GET /v1/agents", Outcome: "unauthenticated", RemoteAddr: "127.0.0.3", RequestID: "req_3"},
	} {
		if err := s.Audit().Append(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := s.Audit().List(tenant.With(ctx, "tenant_b"), 0, 100)
	if err != nil || len(mine) != 1 || mine[0].Principal != "p2" || mine[0].At.IsZero() {
		t.Fatalf("tenant_b's log = %+v, %v", mine, err)
	}
	all, err := s.Audit().ListAll(ctx, "", 0, 100)
	if err != nil || len(all) != 3 || all[0].RequestID != "req_3" || all[0].TenantID != "" {
		t.Fatalf("fleet log = %+v, %v", all, err)
	}
	page, err := s.Audit().ListAll(ctx, "", all[0].ID, 1)
	if err != nil || len(page) != 1 || page[0].RequestID != "req_2" {
		t.Fatalf("second page = %+v, %v", page, err)
	}
	if only, err := s.Audit().ListAll(ctx, tenant.Default, 0, 100); err != nil || len(only) != 1 || only[0].RequestID != "req_1" {
		t.Fatalf("one tenant's = %+v, %v", only, err)
	}
}

// Deleting a tenant leaves nothing of it in any table, counted as the owner
// (who sees through row-level security with owner_access or the tenant
// setting), and leaves other tenants alone.
func TestDeleteTenantLeavesNothing(t *testing.T) {
	s, db, a, _ := setup(t)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_gone", "gone"); err != nil {
		t.Fatal(err)
	}
	g := tenant.With(ctx, "tenant_gone")
	for _, c := range []context.Context{a, g} {
		ag, env := agentAndEnv(t, s, c)
		if _, err := s.Sessions().Create(c, store.Session{AgentID: ag.ID, AgentVersion: ag.Version, EnvironmentID: env.ID}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.APIKeys().Create(c, "k"); err != nil {
			t.Fatal(err)
		}
		two := int32(2)
		if _, err := s.Quotas().Set(c, store.QuotaOverride{RequestBurst: &two}); err != nil {
			t.Fatal(err)
		}
		id, _ := tenant.Required(c)
		if err := s.Audit().Append(ctx, store.AuditRecord{TenantID: id, Principal: "p", Action: "agents:write", Resource: "r", Outcome: "ok", RemoteAddr: "x", RequestID: "req"}); err != nil {
			t.Fatal(err)
		}
	}
	before := db.TenantRows(t, "tenant_gone")
	if before < 8 {
		t.Fatalf("only %d rows of the tenant before deleting; the test set-up is wrong", before)
	}
	other := db.TenantRows(t, string(tenant.Default))
	start := time.Now()
	if err := s.Tenants().Delete(ctx, "tenant_gone"); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted %d rows in %v", before, time.Since(start))
	if n := db.TenantRows(t, "tenant_gone"); n != 0 {
		t.Fatalf("%d rows of the deleted tenant remain", n)
	}
	if n := db.TenantRows(t, string(tenant.Default)); n != other {
		t.Fatalf("the other tenant went from %d rows to %d", other, n)
	}
	if _, err := s.Tenants().Get(ctx, "tenant_gone"); !errdefs.IsNotFound(err) {
		t.Fatalf("Get after delete: %v", err)
	}
}

// A row written for a tenant while it is being deleted (the audit log's
// writer appends in the background, so the record of a request just before
// the delete may land during it) does not make the delete fail: here an
// audit record whose transaction holds its share of the tenant's row until
// the delete waits for it, then commits.
func TestDeleteTenantWithAnAuditRecordLandingMeanwhile(t *testing.T) {
	s, db, _, _ := setup(t)
	ctx := context.Background()
	late, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close(ctx)
	tx, err := late.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT set_config('corral.tenant_id', 'tenant_b', true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO audit_log (tenant_id, principal, action, resource, outcome, remote_addr, request_id)
		VALUES ('tenant_b', 'p', 'api_keys:delete', 'r', 'ok', 'x', 'req')`); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- s.Tenants().Delete(ctx, "tenant_b") }()
	// The delete waits for the record's transaction (the lock of its
	// foreign key check on the tenant's row), as PostgreSQL shows.
	watch, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	waitfor.Cond(t, time.Minute, "the tenant's delete to wait for the audit record", func() bool {
		var n int
		err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%delete_tenant%'`).Scan(&n)
		return err == nil && n == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("deleting the tenant while its audit record landed: %v", err)
	}
	if n := db.TenantRows(t, "tenant_b"); n != 0 {
		t.Fatalf("%d rows of the deleted tenant are left", n)
	}
}

func setup(t *testing.T) (*store.Store, *pgtest.DB, context.Context, context.Context) {
	t.Helper()
	return setupResourcesDB(t)
}

// agentAndEnv makes an agent and an environment in the tenant of ctx.
func agentAndEnv(t *testing.T, s *store.Store, ctx context.Context) (store.Agent, store.Environment) {
	t.Helper()
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: []byte(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	return ag, env
}

// The application role lists operator keys (never their hashes) and
// revokes one through the owner's functions; it still cannot write them.
func TestOperatorKeysListAndRevoke(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	id1, secret1, err := store.BootstrapOperatorKey(ctx, db.OwnerURL, "alice", []string{"operator"})
	if err != nil {
		t.Fatal(err)
	}
	id2, _, err := store.BootstrapOperatorKey(ctx, db.OwnerURL, "bob", []string{"fleet_viewer"})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := s.OperatorKeys().List(ctx)
	if err != nil || len(keys) != 2 || keys[0].ID != id1 || keys[1].ID != id2 || keys[0].Principal != "operator:alice" || keys[1].Roles[0] != "fleet_viewer" || keys[0].TenantID != "" {
		t.Fatalf("List = %+v, %v", keys, err)
	}
	k, err := s.OperatorKeys().Revoke(ctx, id1)
	if err != nil || k.RevokedAt == nil {
		t.Fatalf("Revoke = %+v, %v", k, err)
	}
	again, err := s.OperatorKeys().Revoke(ctx, id1)
	if err != nil || !again.RevokedAt.Equal(*k.RevokedAt) {
		t.Fatalf("a second revoke moved the time: %v then %v (%v)", k.RevokedAt, again.RevokedAt, err)
	}
	if ki, err := s.APIKeys().Authenticate(ctx, secret1); err != nil || !ki.Revoked {
		t.Fatalf("the revoked operator key authenticates as %+v, %v", ki, err)
	}
	if _, err := s.OperatorKeys().Revoke(ctx, "key_nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("revoking an unknown key: %v", err)
	}
	conn, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE operator_keys SET revoked_at = NULL`); err == nil {
		t.Fatal("the application role wrote operator_keys directly")
	}
}
