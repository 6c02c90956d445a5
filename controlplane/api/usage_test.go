package api

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// fakeUsage records the queries it was asked.
type fakeUsage struct {
	rows  int
	asked []store.UsageQuery
	only  []tenant.ID
	mine  []tenant.ID // Report's tenant, from ctx
}

func (f *fakeUsage) Report(ctx context.Context, q store.UsageQuery) ([]store.UsageRow, error) {
	t, _ := tenant.From(ctx)
	f.mine, f.asked = append(f.mine, t), append(f.asked, q)
	return f.make(q), nil
}

func (f *fakeUsage) ReportAll(_ context.Context, only tenant.ID, q store.UsageQuery) ([]store.UsageRow, error) {
	f.only, f.asked = append(f.only, only), append(f.asked, q)
	return f.make(q), nil
}

func (f *fakeUsage) make(q store.UsageQuery) []store.UsageRow {
	var out []store.UsageRow
	for i := q.Offset; i < f.rows && len(out) < q.Limit; i++ {
		out = append(out, store.UsageRow{SessionID: "s", InputTokens: int64(i)})
	}
	return out
}

type fakeTenants struct{}

func (fakeTenants) Get(_ context.Context, id tenant.ID) (store.Tenant, error) {
	if id == "tenant_gone" {
		return store.Tenant{}, errdefs.NotFound("tenant %s not found", id)
	}
	return store.Tenant{ID: id}, nil
}

func TestUsageQueryBounds(t *testing.T) {
	now := time.Date(2026, 5, 10, 12, 34, 0, 0, time.UTC)
	op := auth.With(context.Background(), auth.Principal{Subject: "op"})
	mine := auth.With(context.Background(), auth.Principal{Subject: "p", Tenant: "tenant_a"})
	ts := func(s string) *timestamppb.Timestamp {
		v, _ := time.Parse(time.RFC3339, s)
		return timestamppb.New(v)
	}
	tests := []struct {
		name       string
		ctx        context.Context
		tenant     string
		start, end *timestamppb.Timestamp
		unit       string
		kind       errdefs.Kind
		wantStart  string
		wantEnd    string
	}{
		{name: "defaults: 30 days by day up to the next hour", ctx: op, wantStart: "2026-04-10T00:00:00Z", wantEnd: "2026-05-10T13:00:00Z"},
		{name: "rounded out to hours", ctx: op, unit: "hour", start: ts("2026-05-01T10:20:00Z"), end: ts("2026-05-01T11:05:00Z"), wantStart: "2026-05-01T10:00:00Z", wantEnd: "2026-05-01T12:00:00Z"},
		{name: "32 days by hour", ctx: op, unit: "hour", start: ts("2026-04-01T00:00:00Z"), end: ts("2026-05-03T00:00:00Z"), kind: errdefs.InvalidArgumentKind},
		{name: "401 days by day", ctx: op, start: ts("2025-03-01T00:00:00Z"), end: ts("2026-05-06T00:00:00Z"), kind: errdefs.InvalidArgumentKind},
		{name: "end before start", ctx: op, start: ts("2026-05-02T00:00:00Z"), end: ts("2026-05-01T00:00:00Z"), kind: errdefs.InvalidArgumentKind},
		{name: "unknown granularity", ctx: op, unit: "minute", kind: errdefs.InvalidArgumentKind},
		{name: "an unknown tenant", ctx: op, tenant: "tenant_gone", kind: errdefs.NotFoundKind},
		{name: "a malformed tenant", ctx: op, tenant: "x y", kind: errdefs.NotFoundKind},
		{name: "a tenant's principal asking for another's", ctx: mine, tenant: "tenant_b", kind: errdefs.PermissionDeniedKind},
		{name: "a tenant's principal, its own", ctx: mine, tenant: "tenant_a", wantStart: "2026-04-10T00:00:00Z", wantEnd: "2026-05-10T13:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &UsageService{Usage: &fakeUsage{}, Tenants: fakeTenants{}, Now: func() time.Time { return now }}
			uq, err := s.query(tt.ctx, tt.tenant, tt.start, tt.end, tt.unit)
			if tt.kind != 0 {
				if errdefs.KindOf(err) != tt.kind {
					t.Fatalf("error %v, want kind %v", err, tt.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := uq.q.Start.Format(time.RFC3339); got != tt.wantStart {
				t.Errorf("start %s, want %s", got, tt.wantStart)
			}
			if got := uq.q.End.Format(time.RFC3339); got != tt.wantEnd {
				t.Errorf("end %s, want %s", got, tt.wantEnd)
			}
		})
	}
}

// Pages carry on where the last ended, as of the first page's now; a
// tenant's principal reads through Report in its tenant; a token not
// issued here is refused; an export past its bound is refused.
func TestUsagePagesAndExportBound(t *testing.T) {
	clock := time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)
	u := &fakeUsage{rows: 7}
	s := &UsageService{Usage: u, Tenants: fakeTenants{}, Now: func() time.Time { clock = clock.Add(time.Minute); return clock }}
	ctx := auth.With(context.Background(), auth.Principal{Subject: "p", Tenant: "tenant_a"})
	ctx = tenant.With(ctx, "tenant_a")
	var got int
	tok := ""
	for range 10 {
		r, err := s.GetUsage(ctx, &adminv1.GetUsageRequest{PageSize: 3, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		got += len(r.GetRows())
		if tok = r.GetNextPageToken(); tok == "" {
			break
		}
	}
	if got != 7 || len(u.asked) != 3 {
		t.Fatalf("read %d rows in %d pages, want 7 in 3", got, len(u.asked))
	}
	if !u.asked[1].Now.Equal(u.asked[0].Now) || !u.asked[2].Now.Equal(u.asked[0].Now) {
		t.Errorf("later pages read as of %v and %v, the first %v", u.asked[1].Now, u.asked[2].Now, u.asked[0].Now)
	}
	for _, m := range u.mine {
		if m != "tenant_a" {
			t.Errorf("read in tenant %q", m)
		}
	}
	for _, bad := range []string{"not-base64!", usageToken(-1, clock), "eHh4"} {
		if _, err := s.GetUsage(ctx, &adminv1.GetUsageRequest{PageToken: bad}); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
			t.Errorf("page token %q: %v", bad, err)
		}
	}
	if _, err := s.ExportUsage(ctx, &adminv1.ExportUsageRequest{Format: "xml"}); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
		t.Errorf("format xml: %v", err)
	}
	u.rows = MaxUsageExportRows + 1
	if _, err := s.ExportUsage(ctx, &adminv1.ExportUsageRequest{}); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Errorf("an export of %d rows: %v", u.rows, err)
	}
}
