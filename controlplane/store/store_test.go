package store_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func open(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func exec(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestMigrateConcurrently(t *testing.T) {
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	const nodes = 5
	var wg sync.WaitGroup
	results := make([]store.MigrationResult, nodes)
	errs := make([]error, nodes)
	for i := range nodes {
		wg.Go(func() { results[i], errs[i] = store.Migrate(ctx, db.OwnerURL, nil) })
	}
	wg.Wait()
	applied := map[int64]int{}
	for i := range nodes {
		if errs[i] != nil {
			t.Fatalf("node %d: %v", i, errs[i])
		}
		for _, v := range results[i].Applied {
			applied[v]++
		}
		if results[i].Version != results[0].Version || results[i].Version == 0 {
			t.Fatalf("node %d ended at version %d, node 0 at %d", i, results[i].Version, results[0].Version)
		}
	}
	current, latest, err := open(t, db.AppURL).SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if current != latest {
		t.Fatalf("schema at %d, binary knows %d", current, latest)
	}
	// Each migration ran exactly once across all nodes (version numbers
	// may have gaps: parts of the schema are numbered in blocks).
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("listing migrations: %v", err)
	}
	if len(applied) != len(files) || applied[latest] != 1 {
		t.Fatalf("migrations applied across %d nodes: %v, want each of the %d exactly once", nodes, applied, len(files))
	}
	for v, n := range applied {
		if n != 1 {
			t.Fatalf("migration %d applied %d times", v, n)
		}
	}
	// A second round finds nothing to do.
	again, err := store.Migrate(ctx, db.OwnerURL, nil)
	if err != nil || len(again.Applied) != 0 {
		t.Fatalf("re-run applied %v, err %v", again.Applied, err)
	}
}

func TestSchemaVersionOfEmptyDatabase(t *testing.T) {
	db := pgtest.NewEmpty(t)
	s, err := store.Open(context.Background(), db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cur, latest, err := s.SchemaVersion(context.Background())
	if err != nil || cur != 0 || latest < 1 {
		t.Fatalf("SchemaVersion = %d, %d, %v; want 0, >=1, nil", cur, latest, err)
	}
}

func TestOpenRefusesPrivilegedRoles(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	for name, url := range map[string]string{"owner": db.OwnerURL, "superuser": db.SuperuserURL} {
		_, err := store.Open(ctx, url, store.Options{})
		if !errdefs.IsFailedPrecondition(err) {
			t.Errorf("%s: Open err = %v, want failed precondition", name, err)
		}
	}
	open(t, db.AppURL) // and the application role is accepted
}

func TestOpenUnreachable(t *testing.T) {
	_, err := store.Open(context.Background(), "postgres://u:p@127.0.0.1:1/db?connect_timeout=2", store.Options{})
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("err = %v, want unavailable", err)
	}
	if _, err := store.Open(context.Background(), "postgres://%zz", store.Options{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v, want invalid argument", err)
	}
}

func TestNoTenantNoAccess(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	_, err := s.APIKeys().List(context.Background(), "")
	if errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("List without tenant: err = %v, want unauthenticated", err)
	}
}

func TestTenantIsolation(t *testing.T) {
	db := pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s := open(t, db.AppURL)
	a := tenant.With(context.Background(), tenant.Default)
	b := tenant.With(context.Background(), "tenant_b")

	keyA, secretA, err := s.APIKeys().Create(a, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if keyA.TenantID != tenant.Default {
		t.Fatalf("key tenant = %q", keyA.TenantID)
	}
	if _, _, err := s.APIKeys().Create(b, "b's key"); err != nil {
		t.Fatal(err)
	}

	listA, err := s.APIKeys().List(a, "")
	if err != nil || len(listA) != 1 || listA[0].ID != keyA.ID {
		t.Fatalf("tenant A sees %+v, %v; want only its own key", listA, err)
	}
	if got, err := s.APIKeys().Lookup(a, secretA); err != nil || got.ID != keyA.ID {
		t.Fatalf("Lookup own key: %+v, %v", got, err)
	}
	if _, err := s.APIKeys().Lookup(b, secretA); !errdefs.IsNotFound(err) {
		t.Fatalf("tenant B looked up A's key: err = %v, want not found", err)
	}
	if cur, err := s.Tenants().Current(b); err != nil || cur.Name != "b" {
		t.Fatalf("Current(b) = %+v, %v", cur, err)
	}

	// Row-level security holds even for SQL that forgets its WHERE clause or
	// names another tenant outright.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("without the tenant setting the app role sees %d keys (err %v); want 0", n, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT set_config('corral.tenant_id', 'tenant_b', true)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE tenant_id = 'tenant_default'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("tenant B counted %d of the default tenant's keys (err %v)", n, err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO api_keys (tenant_id, id, name, secret_hash) VALUES ('tenant_default', 'key_x', 'x', 'x')`)
	if err == nil {
		t.Fatal("tenant B wrote a row into the default tenant")
	}
}

func TestAPIKeyValidation(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	if _, _, err := s.APIKeys().Create(ctx, "  "); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty name: err = %v", err)
	}
	_, secret, err := s.APIKeys().Create(ctx, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if len(secret.Reveal()) < 40 || secret.Reveal()[:len(store.APIKeyPrefix)] != store.APIKeyPrefix {
		t.Fatalf("secret %q lacks the prefix or entropy", secret.Reveal())
	}
}

// The tenant id reaches SQL text when a transaction starts; only well-formed
// ids get that far.
func TestMalformedTenantRefused(t *testing.T) {
	s := open(t, pgtest.New(t).AppURL)
	bad := tenant.With(context.Background(), "tenant_x', true); DROP TABLE api_keys; --")
	if _, err := s.APIKeys().List(bad, ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("List with a malformed tenant: %v, want invalid argument", err)
	}
	if _, err := s.APIKeys().List(tenant.With(context.Background(), tenant.Default), ""); err != nil {
		t.Fatalf("the table is gone or the store is broken: %v", err)
	}
}

// Every table with a tenant_id column is guarded: row-level security enabled
// and forced, a policy on it, and the application role sees none of another
// tenant's rows even when its SQL names that tenant outright. A new
// tenant-owned table that forgets any of this fails here.
func TestEveryTenantTableIsGuarded(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	su, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	rows, err := su.Query(ctx, `
		SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
		       (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
		WHERE c.relkind = 'r'
		  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
		ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		var enabled, forced bool
		var policies int
		if err := rows.Scan(&name, &enabled, &forced, &policies); err != nil {
			t.Fatal(err)
		}
		if !enabled || !forced || policies == 0 {
			t.Errorf("table %s: row-level security enabled=%v forced=%v, %d policies", name, enabled, forced, policies)
		}
		tables = append(tables, name)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(tables) < 5 {
		t.Fatalf("found only %v with a tenant_id column; the query is wrong", tables)
	}

	// Put a row of the default tenant's into the tables the API fills, as
	// the superuser, then look as another tenant.
	s := open(t, db.AppURL)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	if _, _, err := s.APIKeys().Create(tenant.With(ctx, tenant.Default), "a"); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO agents (tenant_id, id, latest_version) VALUES ('tenant_default', 'agent_a', 1)`,
		`INSERT INTO agent_versions (tenant_id, agent_id, version, name, spec) VALUES ('tenant_default', 'agent_a', 1, 'a', '{}')`,
		`INSERT INTO environments (tenant_id, id, name, config) VALUES ('tenant_default', 'env_a', 'a', '{}')`,
		`INSERT INTO sessions (tenant_id, id, agent_id, agent_version, agent, environment_id) VALUES ('tenant_default', 'sesn_a', 'agent_a', 1, '{}', 'env_a')`,
		`INSERT INTO events (tenant_id, session_id, seq, id, type, body) VALUES ('tenant_default', 'sesn_a', 1, 'sevt_a', 'user.message', '{}')`,
		`INSERT INTO session_mcp_tools (tenant_id, session_id, server_name, tools) VALUES ('tenant_default', 'sesn_a', 'docs', '[]')`,
		`INSERT INTO session_requests (tenant_id, session_id, idempotency_key, request_sha256) VALUES ('tenant_default', 'sesn_a', 'k', '\x` + strings.Repeat("00", 32) + `')`,
		`INSERT INTO workspace_snapshots (tenant_id, session_id, seq, blob_key, full_copy, origin, host_id, sandbox_id, taken_at, files, bytes) VALUES ('tenant_default', 'sesn_a', 1, 'snapshots/a/1.tar', true, 'turn', 'h1', 'sb1', now(), 1, 1)`,
		`INSERT INTO tenant_quotas (tenant_id, concurrent_sessions) VALUES ('tenant_default', 3)`,
		`INSERT INTO tenant_token_usage (tenant_id, day, tokens) VALUES ('tenant_default', current_date, 5)`,
		`INSERT INTO usage_model_tokens (tenant_id, session_id, model, hour, input_tokens) VALUES ('tenant_default', 'sesn_a', 'm', date_trunc('hour', now()), 1)`,
		`INSERT INTO usage_sandbox_intervals (tenant_id, session_id, state, host_id, started_at) VALUES ('tenant_default', 'sesn_a', 'running', 'h1', now())`,
		`INSERT INTO tenant_data_keys (tenant_id, seal_key_id, nonce, sealed) VALUES ('tenant_default', 'k1', '\x00', '\x00')`,
		`INSERT INTO vaults (tenant_id, id, display_name) VALUES ('tenant_default', 'vlt_a', 'a')`,
		`INSERT INTO files (tenant_id, id, filename, mime_type, size_bytes, downloadable, blob_key) VALUES ('tenant_default', 'file_a', 'a.csv', 'text/csv', 1, true, 'files/tenant_default/file_a')`,
		`INSERT INTO skills (tenant_id, id, name, display_name, latest_version_id) VALUES ('tenant_default', 'skill_a', 'a', 'a', 'skillver_a')`,
		`INSERT INTO skill_versions (tenant_id, skill_id, id, name, description, size_bytes, file_count, blob_key) VALUES ('tenant_default', 'skill_a', 'skillver_a', 'a', 'd', 1, 1, 'skills/tenant_default/skill_a/skillver_a/bundle.zip')`,
		`INSERT INTO vault_credentials (tenant_id, vault_id, id, auth_type, mcp_server_url, match_url, secret_nonce, secret) VALUES ('tenant_default', 'vlt_a', 'vcrd_a', 'static_bearer', 'https://m/x', 'https://m/x', '\x00', '\x00')`,
		`INSERT INTO environment_work (tenant_id, id, environment_id, session_id) VALUES ('tenant_default', 'work_a', 'env_a', 'sesn_a')`,
		`INSERT INTO environment_workers (tenant_id, environment_id, worker_id) VALUES ('tenant_default', 'env_a', 'w1')`,
		`INSERT INTO memory_stores (tenant_id, id, name) VALUES ('tenant_default', 'memstore_a', 'a')`,
		`INSERT INTO memories (tenant_id, store_id, id, path, content, content_sha256, size_bytes, memory_version_id) VALUES ('tenant_default', 'memstore_a', 'mem_a', '/a.md', 'a', '` + strings.Repeat("0", 64) + `', 1, 'memver_a')`,
		`INSERT INTO memory_versions (tenant_id, store_id, id, memory_id, operation, path, content, actor_type, actor_id) VALUES ('tenant_default', 'memstore_a', 'memver_a', 'mem_a', 'created', '/a.md', 'a', 'api_actor', 'key_a')`,
		`INSERT INTO audit_log (tenant_id, principal, action, resource, outcome, remote_addr, request_id) VALUES ('tenant_default', 'p', 'agents:write', 'agent_a', 'ok', '127.0.0.1', 'req_a')`,
		`INSERT INTO egress_connections (tenant_id, session_id, host_id, dest_host, dest_port, address, allowed, reason, bytes_up, bytes_down, started_at, ended_at) VALUES ('tenant_default', 'sesn_a', 'h1', 'a.test', 443, '', false, 'host not allowed', 0, 0, now(), now())`,
		`INSERT INTO environment_builds (tenant_id, key, image, base_image, packages, mirrors, environment_id) VALUES ('tenant_default', 'k', 'corral.build/packages:k', 'base:1', '{}', '{}', 'env_a')`,
	} {
		exec(t, db.SuperuserURL, stmt)
	}
	app, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	for _, table := range tables {
		var mine, total int
		err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('corral.tenant_id', 'tenant_b', true)`); err != nil {
				return err
			}
			q := `SELECT count(*) FROM ` + pgx.Identifier{table}.Sanitize() + ` WHERE tenant_id = 'tenant_default'`
			return tx.QueryRow(ctx, q).Scan(&mine)
		})
		if err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if err := su.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE tenant_id = 'tenant_default'`).Scan(&total); err != nil {
			t.Fatal(err)
		}
		if total == 0 {
			t.Errorf("%s holds no default-tenant row; the check below would prove nothing", table)
		}
		if mine != 0 {
			t.Errorf("%s: tenant_b sees %d of the default tenant's rows", table, mine)
		}
	}
}

// queryTableRef is a table named after FROM, JOIN or UPDATE, with its alias.
var queryTableRef = regexp.MustCompile(`(?i)\b(FROM|JOIN|UPDATE)\s+([a-z_][a-z0-9_]*)(?:\s+(?:AS\s+)?([a-z_][a-z0-9_]*))?`)

// notAlias are the words that may follow a table name without being its alias.
var notAlias = map[string]bool{
	"where": true, "set": true, "join": true, "left": true, "inner": true, "cross": true,
	"on": true, "using": true, "order": true, "group": true, "limit": true, "for": true, "returning": true,
}

// TestQueriesFilterByTenant is the application's half of tenant isolation:
// row-level security confines every query underneath, and every query in
// queries/*.sql that reads, updates or deletes a tenant-owned table must
// also say which tenant, with a value the Go code passes, so that the
// queries stay confined if a table ever lost its policy.
//
// The check is textual. For each table with a tenant_id column named after
// FROM, UPDATE or DELETE FROM, the query must contain
// "[alias.]tenant_id = <parameter>" ($n, sqlc.arg(tenant_id) or @tenant_id,
// either way round); a table named after JOIN may instead match another
// table's tenant_id ("v.tenant_id = a.tenant_id"). INSERTs are not checked
// (their rows carry tenant_id). It does not catch a filter that is OR-ed
// away, one that sits in the wrong subquery, a parameter the caller fills
// with the wrong tenant, nor SQL written in Go (appendSQL, the SECURITY
// DEFINER functions); it does catch a query that forgets the tenant.
func TestQueriesFilterByTenant(t *testing.T) {
	tables := map[string]bool{}
	for _, name := range pgtest.New(t).TenantTables(t) {
		tables[name] = true
	}
	files, err := filepath.Glob("../../queries/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("listing queries: %v", err)
	}
	header := regexp.MustCompile(`^-- name: (\w+) :\w+`)
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		queries := map[string]*strings.Builder{}
		var names []string
		var cur *strings.Builder
		for line := range strings.Lines(string(text)) {
			if m := header.FindStringSubmatch(line); m != nil {
				cur = &strings.Builder{}
				queries[m[1]] = cur
				names = append(names, m[1])
				continue
			}
			if code, _, _ := strings.Cut(line, "--"); cur != nil {
				cur.WriteString(code + " ")
			}
		}
		for _, name := range names {
			sql := queries[name].String()
			for _, ref := range queryTableRef.FindAllStringSubmatch(sql, -1) {
				table := strings.ToLower(ref[2])
				if !tables[table] {
					continue
				}
				checked++
				if !filtersTenant(sql, table, strings.ToLower(ref[3]), strings.EqualFold(ref[1], "JOIN")) {
					t.Errorf("%s: query %s reads or writes %s without a tenant_id condition on it", filepath.Base(file), name, table)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d table references in %v; the parser is wrong", checked, files)
	}
}

// filtersTenant reports whether sql has a tenant_id condition on table
// (named alias, if any): against a parameter, or for a joined table, against
// another table's tenant_id.
func filtersTenant(sql, table, alias string, joined bool) bool {
	col := `(?:` + regexp.QuoteMeta(table) + `\.)?tenant_id`
	if alias != "" && !notAlias[alias] {
		col = regexp.QuoteMeta(alias) + `\.tenant_id`
	}
	other := `(?:\$\d+|sqlc\.arg\(\s*'?tenant_id'?\s*\)|@tenant_id)`
	if joined {
		other = `(?:` + other + `|\w+\.tenant_id)`
	}
	re := regexp.MustCompile(`(?i)(?:^|[^\w.])` + col + `\s*=\s*` + other + `|` + other + `\s*=\s*` + col + `\b`)
	return re.MatchString(sql)
}

// The application's tenant filter works on its own: with row-level security
// switched off on agents and agent_versions (as a lost policy would leave
// them), tenant B still cannot read, list, update or archive tenant A's agent
// through the store.
func TestTenantFilterWithoutRowLevelSecurity(t *testing.T) {
	db := pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s := open(t, db.AppURL)
	ctx := context.Background()
	a := tenant.With(ctx, tenant.Default)
	b := tenant.With(ctx, "tenant_b")
	agentA, err := s.Agents().Create(a, "a", spec("a"))
	if err != nil {
		t.Fatal(err)
	}
	agentB, err := s.Agents().Create(b, "b", spec("b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"agents", "agent_versions"} {
		exec(t, db.SuperuserURL, `ALTER TABLE `+table+` NO FORCE ROW LEVEL SECURITY`)
		exec(t, db.SuperuserURL, `ALTER TABLE `+table+` DISABLE ROW LEVEL SECURITY`)
	}

	// Row-level security is really off: SQL without the filter, in tenant
	// B's transaction, sees A's agent and its version.
	app, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	var agents, versions int
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('corral.tenant_id', 'tenant_b', true)`); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM agents WHERE id = $1`, agentA.ID).Scan(&agents); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM agent_versions WHERE agent_id = $1`, agentA.ID).Scan(&versions)
	})
	if err != nil {
		t.Fatal(err)
	}
	if agents != 1 || versions != 1 {
		t.Fatalf("with row-level security off, tenant B's unfiltered SQL sees %d agents and %d versions of A's; want 1 and 1, or this test proves nothing", agents, versions)
	}

	// The store, as tenant B, does not.
	for _, v := range []int64{0, 1} {
		if got, err := s.Agents().Get(b, agentA.ID, v); !errdefs.IsNotFound(err) {
			t.Errorf("B Get(A's agent, version %d) = %+v, %v; want not found", v, got, err)
		}
	}
	if got, _, err := s.Agents().ListVersions(b, agentA.ID, 10, 0); !errdefs.IsNotFound(err) {
		t.Errorf("B ListVersions(A's agent) = %+v, %v; want not found", got, err)
	}
	list, _, err := s.Agents().List(b, store.AgentListOptions{IncludeArchived: true})
	if err != nil || len(list) != 1 || list[0].ID != agentB.ID {
		t.Errorf("B List = %+v, %v; want only its own agent %s", list, err, agentB.ID)
	}
	applied := false
	_, err = s.Agents().Update(b, agentA.ID, func(cur store.Agent) (string, json.RawMessage, error) {
		applied = true
		return "taken", spec("taken"), nil
	})
	if !errdefs.IsNotFound(err) || applied {
		t.Errorf("B Update(A's agent): err = %v, apply called %v; want not found, not called", err, applied)
	}
	if got, err := s.Agents().Archive(b, agentA.ID); !errdefs.IsNotFound(err) {
		t.Errorf("B Archive(A's agent) = %+v, %v; want not found", got, err)
	}

	// A's agent is as A left it.
	got, err := s.Agents().Get(a, agentA.ID, 0)
	if err != nil || got.LatestVersion != 1 || got.Name != "a" || got.ArchivedAt != nil {
		t.Fatalf("A's agent after B's attempts: %+v, %v; want version 1 named a, not archived", got, err)
	}
}
