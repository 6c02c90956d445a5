package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// The egress trail is per tenant (row-level security), filtered by
// session, paged newest first, and its fields are cut before they are
// stored.
func TestEgressTrail(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	recs := []store.EgressRecord{
		{TenantID: tenant.Default, SessionID: "sesn_1", Host: "allowed.test", Port: 443, Address: "192.0.2.1:443", Allowed: true, CredentialInjected: true, BytesUp: 10, BytesDown: 20, Start: now, End: now},
		{TenantID: tenant.Default, SessionID: "sesn_2", Host: strings.Repeat("h", 1000), Port: 443, Reason: "host not allowed", Start: now, End: now},
		{TenantID: "tenant_b", SessionID: "sesn_3", Host: "b.test", Port: 80, Reason: "host not allowed", Start: now, End: now},
		{TenantID: "not a tenant id!", SessionID: "x", Host: "x.test"},
	}
	skipped, err := s.Egress().Append(ctx, "host-1", recs)
	if err != nil || skipped != 1 {
		t.Fatalf("Append: %d skipped, %v", skipped, err)
	}
	def := tenant.With(ctx, tenant.Default)
	all, err := s.Egress().List(def, "", 0, 100)
	if err != nil || len(all) != 2 || all[0].SessionID != "sesn_2" || len(all[0].Host) != 253 || all[0].Allowed {
		t.Fatalf("default's trail = %+v, %v", all, err)
	}
	one, err := s.Egress().List(def, "sesn_1", 0, 100)
	if err != nil || len(one) != 1 {
		t.Fatalf("sesn_1's = %+v, %v", one, err)
	}
	if r := one[0]; !r.Allowed || !r.CredentialInjected || all[0].CredentialInjected || r.HostID != "host-1" || r.Host != "allowed.test" || r.BytesDown != 20 || !r.Start.Equal(now) || r.RecordedAt.IsZero() {
		t.Fatalf("record %+v", r)
	}
	if page, err := s.Egress().List(def, "", all[0].ID, 1); err != nil || len(page) != 1 || page[0].SessionID != "sesn_1" {
		t.Fatalf("second page = %+v, %v", page, err)
	}
	// Tenant b sees its own record only, even asking for another's session.
	b := tenant.With(ctx, "tenant_b")
	if bs, err := s.Egress().List(b, "", 0, 100); err != nil || len(bs) != 1 || bs[0].Host != "b.test" {
		t.Fatalf("tenant_b's = %+v, %v", bs, err)
	}
	if bs, err := s.Egress().List(b, "sesn_1", 0, 100); err != nil || len(bs) != 0 {
		t.Fatalf("tenant_b asking for sesn_1 = %+v, %v", bs, err)
	}
}
