package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TenantTables names the tables with a tenant_id column, as the superuser
// sees them.
func (db *DB) TenantTables(t testing.TB) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
		WHERE c.relkind IN ('r', 'p')
		  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
		ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) < 5 {
		t.Fatalf("pgtest: found only %v with a tenant_id column; the query is wrong", tables)
	}
	return tables
}

// TenantRows counts tenant id's rows, as the superuser (who row-level
// security does not bind), in every table with a tenant_id column, plus its
// row in tenants: what deleting a tenant must bring to zero.
func (db *DB) TenantRows(t testing.TB, id string) int {
	t.Helper()
	tables := db.TenantTables(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	total := 0
	for _, tbl := range append(tables, "tenants") {
		col := "tenant_id"
		if tbl == "tenants" {
			col = "id"
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{tbl}.Sanitize()+` WHERE `+col+` = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}
