package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// A service principal's keys act as it: they carry its roles, follow a
// change of them, and stop when it is disabled. Another tenant sees none of
// it.
func TestServicePrincipalsHoldKeys(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	b, other := tenant.With(ctx, "tenant_b"), tenant.With(ctx, tenant.Default)

	// A key issued without a principal gets one of its own, named after it.
	k1, secret1, err := s.APIKeys().Issue(b, store.NewAPIKey{Name: "ci", Roles: []string{"developer"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Principals().Get(b, k1.PrincipalID)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != store.PrincipalService || p.Name != "ci" || !slices.Equal(p.Roles, []string{"developer"}) || k1.Principal != "service:ci" {
		t.Fatalf("principal %+v, key %+v", p, k1)
	}
	// A second key of the same principal has its roles; roles of its own are refused.
	if _, _, err := s.APIKeys().Issue(b, store.NewAPIKey{Name: "ci-2", PrincipalID: p.ID, Roles: []string{"admin"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("key with roles of its own for an existing principal: %v", err)
	}
	k2, secret2, err := s.APIKeys().Issue(b, store.NewAPIKey{Name: "ci-2", PrincipalID: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	if k2.PrincipalID != p.ID || !slices.Equal(k2.Roles, []string{"developer"}) {
		t.Fatalf("second key %+v", k2)
	}
	if keys, err := s.APIKeys().List(b, p.ID); err != nil || len(keys) != 2 {
		t.Fatalf("the principal's keys: %v, %v", keys, err)
	}

	// Granting roles changes every key at once.
	if _, err := s.Principals().SetRoles(b, p.ID, []string{"viewer", "developer"}); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{secret1.Reveal(), secret2.Reveal()} {
		ki, err := s.APIKeys().Authenticate(ctx, logging.Secret(secret))
		if err != nil || ki.PrincipalID != p.ID || !slices.Equal(ki.Roles, []string{"viewer", "developer"}) || ki.Disabled {
			t.Fatalf("after granting: %+v, %v", ki, err)
		}
	}
	// Disabling it disables every key; disabling twice keeps the first time.
	d1, err := s.Principals().SetDisabled(b, p.ID, true)
	if err != nil || !d1.Disabled() {
		t.Fatalf("disable: %+v, %v", d1, err)
	}
	d2, err := s.Principals().SetDisabled(b, p.ID, true)
	if err != nil || !d2.DisabledAt.Equal(*d1.DisabledAt) {
		t.Fatalf("disabling twice moved the time: %v then %v (%v)", d1.DisabledAt, d2.DisabledAt, err)
	}
	for _, secret := range []string{secret1.Reveal(), secret2.Reveal()} {
		if ki, err := s.APIKeys().Authenticate(ctx, logging.Secret(secret)); err != nil || !ki.Disabled {
			t.Fatalf("key of a disabled principal: %+v, %v", ki, err)
		}
	}
	if e, err := s.Principals().SetDisabled(b, p.ID, false); err != nil || e.Disabled() {
		t.Fatalf("enable: %+v, %v", e, err)
	}
	if ki, _ := s.APIKeys().Authenticate(ctx, secret1); ki.Disabled {
		t.Fatal("still disabled after enabling")
	}

	// Another tenant neither sees nor changes it, nor issues keys for it.
	if ps, err := s.Principals().List(other); err != nil || slices.ContainsFunc(ps, func(q store.Principal) bool { return q.ID == p.ID }) {
		t.Fatalf("another tenant's list: %v, %v", ps, err)
	}
	if _, err := s.Principals().Get(other, p.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("get across tenants: %v", err)
	}
	if _, err := s.Principals().SetRoles(other, p.ID, []string{"admin"}); !errdefs.IsNotFound(err) {
		t.Fatalf("grant across tenants: %v", err)
	}
	if _, err := s.Principals().SetDisabled(other, p.ID, true); !errdefs.IsNotFound(err) {
		t.Fatalf("disable across tenants: %v", err)
	}
	if _, _, err := s.APIKeys().Issue(other, store.NewAPIKey{Name: "stolen", PrincipalID: p.ID}); !errdefs.IsNotFound(err) {
		t.Fatalf("key for another tenant's principal: %v", err)
	}
}

// Users are made on first sight of their token's issuer and subject, or
// ahead of it; either way one record per tenant, issuer and subject.
func TestUsers(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	a, b := tenant.With(ctx, tenant.Default), tenant.With(ctx, "tenant_b")
	const iss = "https://idp.example"

	for _, bad := range []store.NewPrincipal{
		{Kind: "robot", Name: "r"},
		{Kind: store.PrincipalService},
		{Kind: store.PrincipalService, Name: "s", Issuer: iss, Subject: "x"},
		{Kind: store.PrincipalUser, Name: "u"},
		{Kind: store.PrincipalUser, Issuer: iss},
		{Kind: store.PrincipalUser, Issuer: iss, Subject: string(make([]byte, 300))},
		{Kind: store.PrincipalService, Name: "ci\nservice:admin"},
	} {
		if _, err := s.Principals().Create(a, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Create(%+v) = %v, want invalid argument", bad, err)
		}
	}

	u1, err := s.Principals().SeenUser(a, iss, "alice", "alice@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if u1.Kind != store.PrincipalUser || u1.Name != "alice@example.com" || u1.LastSeenAt == nil || len(u1.Roles) != 0 {
		t.Fatalf("first sight: %+v", u1)
	}
	u2, err := s.Principals().SeenUser(a, iss, "alice", "renamed")
	if err != nil || u2.ID != u1.ID || !u2.LastSeenAt.Equal(*u1.LastSeenAt) {
		t.Fatalf("second sight within a minute: %+v, %v (first %+v)", u2, err, u1)
	}
	// The same subject in another tenant is another principal.
	ub, err := s.Principals().SeenUser(b, iss, "alice", "")
	if err != nil || ub.ID == u1.ID || ub.Name != "alice" {
		t.Fatalf("other tenant: %+v, %v", ub, err)
	}
	// Made ahead, with roles; its first token finds that record.
	pre, err := s.Principals().Create(a, store.NewPrincipal{Kind: store.PrincipalUser, Issuer: iss, Subject: "bob", Roles: []string{"viewer"}})
	if err != nil || pre.Name != "bob" {
		t.Fatalf("create ahead: %+v, %v", pre, err)
	}
	if _, err := s.Principals().Create(a, store.NewPrincipal{Kind: store.PrincipalUser, Issuer: iss, Subject: "bob"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second record of one subject: %v", err)
	}
	seen, err := s.Principals().SeenUser(a, iss, "bob", "bob@example.com")
	if err != nil || seen.ID != pre.ID || !slices.Equal(seen.Roles, []string{"viewer"}) || seen.LastSeenAt == nil {
		t.Fatalf("first token of a user made ahead: %+v, %v", seen, err)
	}
	// Keys belong to services, not users.
	if _, _, err := s.APIKeys().Issue(a, store.NewAPIKey{Name: "k", PrincipalID: pre.ID}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("key for a user: %v", err)
	}
}

// Keys issued before principals existed each get a service principal with
// the key's roles; the migration back restores them.
func TestPrincipalsMigrationKeepsKeys(t *testing.T) {
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	if err := store.MigrateTo(ctx, db.OwnerURL, 30); err != nil {
		t.Fatal(err)
	}
	_, secret1, hash1, prefix1 := store.NewOperatorKey() // the same shape as a tenant key
	_, secret2, hash2, prefix2 := store.NewOperatorKey()
	exec(t, db.SuperuserURL, `INSERT INTO api_keys (tenant_id, id, name, secret_hash, principal, roles, prefix) VALUES
		('tenant_default', 'key_one', 'ci', $1, 'key:ci', '{developer}', $2),
		('tenant_default', 'key_two', 'ci', $3, 'key:ci', '{viewer}', $4)`, hash1, prefix1, hash2, prefix2)
	if _, err := store.Migrate(ctx, db.OwnerURL, nil); err != nil {
		t.Fatal(err)
	}
	s := open(t, db.AppURL)
	for secret, want := range map[string]string{secret1.Reveal(): "developer", secret2.Reveal(): "viewer"} {
		ki, err := s.APIKeys().Authenticate(ctx, logging.Secret(secret))
		if err != nil || ki.PrincipalID == "" || ki.Principal != "service:ci" || !slices.Equal(ki.Roles, []string{want}) {
			t.Fatalf("key after the migration: %+v, %v", ki, err)
		}
	}
	if err := store.MigrateTo(ctx, db.OwnerURL, 30); err != nil {
		t.Fatal(err)
	}
	var roles []string
	var principal string
	conn, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT principal, roles FROM api_keys WHERE id = 'key_two'`).Scan(&principal, &roles); err != nil {
		t.Fatal(err)
	}
	if principal != "key:ci" || !slices.Equal(roles, []string{"viewer"}) {
		t.Fatalf("after migrating down: principal %q roles %v", principal, roles)
	}
}
