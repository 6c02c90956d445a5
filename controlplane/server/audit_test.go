package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Writes and refusals on both APIs are audited with who, what, where and
// how it ended; a tenant's admins see their tenant's records (operators'
// actions on it included) only, operators see all; no record holds a key.
func TestAuditLog(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	base := "http://" + srv.HTTPAddr()
	adminKey := servertest.TenantKey(t, srv, "tenant_a")
	viewerKey := servertest.TenantKey(t, srv, "tenant_a", "viewer")
	otherKey := servertest.TenantKey(t, srv, tenant.Default)
	opKey := servertest.OperatorKey(t, db)
	ctx := context.Background()

	postJSON(t, withKey(adminKey), base+"/v1/agents", map[string]any{"name": "a", "model": "m"}) // a write
	req, _ := http.NewRequest("POST", base+"/v1/agents", strings.NewReader(`{"name":"b","model":"m"}`))
	req.Header.Set("x-api-key", viewerKey) // refused: viewers do not write
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Fatalf("viewer write: %v %v", resp, err)
	}
	req, _ = http.NewRequest("GET", base+"/v1/agents", nil)
	req.Header.Set("x-api-key", "sk-corral-not-a-key") // refused: unknown key
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("unknown key: %v %v", resp, err)
	}
	op := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), opKey))
	if _, err := op.CreateTenant(ctx, &adminv1.CreateTenantRequest{TenantId: "tenant_new", Name: "new"}); err != nil {
		t.Fatal(err)
	}

	// The writer is asynchronous: wait for the four records.
	var all *adminv1.ListAuditLogResponse
	waitfor.State(t, 30*time.Second, "four audit records", func() (bool, string) {
		var err error
		all, err = op.ListAuditLog(ctx, &adminv1.ListAuditLogRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(all.Records) >= 4, fmt.Sprintf("%d records", len(all.Records))
	})
	type rec struct{ tenant, action, outcome string }
	var got []rec
	for _, r := range all.Records {
		if r.RequestId == "" || r.RemoteAddr == "" || r.At == nil || r.Principal == "" {
			t.Errorf("incomplete record %+v", r)
		}
		got = append(got, rec{r.TenantId, r.Action, r.Outcome})
		t.Logf("%s %s %s %s %s %s", r.TenantId, r.Principal, r.Action, r.Resource, r.Outcome, r.RemoteAddr)
	}
	want := []rec{ // newest first
		{"tenant_new", "tenants:write", "ok"}, // an operator's action on a tenant is that tenant's row
		{"", "", "unauthenticated"},
		{"tenant_a", "agents:write", "denied"},
		{"tenant_a", "agents:write", "ok"},
	}
	if len(got) != len(want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d = %v, want %v (all %v)", i, got[i], want[i], got)
		}
	}

	// Tenant A's admin sees A's two records; the default tenant's none of them.
	mine, err := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), adminKey)).ListAuditLog(ctx, &adminv1.ListAuditLogRequest{})
	if err != nil || len(mine.Records) != 2 {
		t.Fatalf("tenant A's admin sees %v, %v", mine, err)
	}
	// An operator's change to tenant A's quota shows in A's log.
	five := int32(5)
	if _, err := op.SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: "tenant_a", Overrides: &adminv1.QuotaOverride{ConcurrentSessions: &five}}); err != nil {
		t.Fatal(err)
	}
	adminLog := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), adminKey))
	waitfor.State(t, 30*time.Second, "tenant A's third audit record", func() (bool, string) {
		mine, err = adminLog.ListAuditLog(ctx, &adminv1.ListAuditLogRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(mine.Records) >= 3, fmt.Sprintf("%d records", len(mine.Records))
	})
	if len(mine.Records) != 3 || mine.Records[0].Action != "tenant_quotas:write" || mine.Records[0].Principal != "operator:test" {
		t.Fatalf("tenant A's log after the operator's quota change: %v", mine.Records)
	}
	theirs, err := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), otherKey)).ListAuditLog(ctx, &adminv1.ListAuditLogRequest{TenantId: "tenant_a"})
	if err == nil {
		t.Fatalf("the default tenant read tenant A's audit log: %v", theirs)
	}

	// No key, in full or in part beyond its prefix, is in the log.
	conn, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE concat_ws(' ', principal, action, resource, outcome, remote_addr, request_id) LIKE '%sk-corral-%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d audit records hold a key (%v)", n, err)
	}
}
