package store

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Tenant statuses.
const (
	TenantActive    = "active"
	TenantSuspended = "suspended"
)

// Tenant is a tenant as the rest of corral sees it.
type Tenant struct {
	ID        tenant.ID
	Name      string
	Status    string
	CreatedAt time.Time
}

// Tenants reads and administers tenants. Reads and writes of one tenant run
// in that tenant's scope; only List sees them all.
type Tenants struct{ s *Store }

// Tenants returns the tenant repository.
func (s *Store) Tenants() Tenants { return Tenants{s} }

// Current returns the tenant in ctx.
func (r Tenants) Current(ctx context.Context) (Tenant, error) {
	var t Tenant
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetTenant(ctx, tid)
		if err != nil {
			return translate(err, "tenant "+tid)
		}
		t = tenantFromRow(row)
		return nil
	})
	return t, err
}

// Get returns tenant id.
func (r Tenants) Get(ctx context.Context, id tenant.ID) (Tenant, error) {
	if err := id.Validate(); err != nil {
		return Tenant{}, errdefs.NotFound("tenant %s not found", id)
	}
	return r.Current(tenant.With(ctx, id))
}

// Create adds tenant id named name.
func (r Tenants) Create(ctx context.Context, id tenant.ID, name string) (Tenant, error) {
	if err := id.Validate(); err != nil {
		return Tenant{}, err
	}
	if name = strings.TrimSpace(name); name == "" || len(name) > 200 {
		return Tenant{}, errdefs.InvalidArgument("tenant name must be 1 to 200 characters")
	}
	var t Tenant
	err := r.s.inTenant(tenant.With(ctx, id), func(q *db.Queries, tid string) error {
		row, err := q.CreateTenant(ctx, db.CreateTenantParams{ID: tid, Name: name})
		if err != nil {
			return translate(err, "tenant "+string(id))
		}
		t = tenantFromRow(db.GetTenantRow(row))
		return nil
	})
	return t, err
}

// SetStatus suspends or reactivates tenant id. A suspended tenant's keys and
// tokens are refused.
func (r Tenants) SetStatus(ctx context.Context, id tenant.ID, status string) (Tenant, error) {
	if status != TenantActive && status != TenantSuspended {
		return Tenant{}, errdefs.InvalidArgument("tenant status %q: want active or suspended", status)
	}
	if err := id.Validate(); err != nil {
		return Tenant{}, errdefs.NotFound("tenant %s not found", id)
	}
	var t Tenant
	err := r.s.inTenant(tenant.With(ctx, id), func(q *db.Queries, tid string) error {
		row, err := q.SetTenantStatus(ctx, db.SetTenantStatusParams{ID: tid, Status: status})
		if err != nil {
			return translate(err, "tenant "+string(id))
		}
		t = tenantFromRow(db.GetTenantRow(row))
		return nil
	})
	return t, err
}

// List returns every tenant, oldest first, through the list_tenants
// function. Only fleet principals may call it.
func (r Tenants) List(ctx context.Context) ([]Tenant, error) {
	rows, err := r.s.pool.Query(ctx, `SELECT id, name, status, created_at FROM list_tenants()`)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "listing tenants")
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		var row db.GetTenantRow
		if err := rows.Scan(&row.ID, &row.Name, &row.Status, &row.CreatedAt); err != nil {
			return nil, err
		}
		out = append(out, tenantFromRow(row))
	}
	return out, rows.Err()
}

// Delete removes tenant id and every row it owns in every table, in one
// transaction (the delete_tenant function). Open event streams of its
// sessions end when it commits; their loops find the sessions gone.
func (r Tenants) Delete(ctx context.Context, id tenant.ID) error {
	if err := id.Validate(); err != nil {
		return errdefs.NotFound("tenant %s not found", id)
	}
	if _, err := r.Get(ctx, id); err != nil {
		return err
	}
	if _, err := r.s.pool.Exec(ctx, `SELECT delete_tenant($1)`, string(id)); err != nil {
		return translate(err, "deleting tenant "+string(id))
	}
	return nil
}

func tenantFromRow(row db.GetTenantRow) Tenant {
	return Tenant{ID: tenant.ID(row.ID), Name: row.Name, Status: row.Status, CreatedAt: row.CreatedAt.Time}
}

// QuotaOverride is a tenant's own limits; a nil field means the policy's
// default applies.
type QuotaOverride struct {
	ConcurrentSessions  *int32
	ConcurrentSandboxes *int32
	CPUMillis           *int32
	MemoryMiB           *int32
	RequestsPerSecond   *int32
	RequestBurst        *int32
	FileStorageMiB      *int32
	ModelTokensPerDay   *int64
}

// Quotas reads and writes tenants' quota overrides.
type Quotas struct{ s *Store }

// Quotas returns the quota repository.
func (s *Store) Quotas() Quotas { return Quotas{s} }

// Get returns the overrides of the tenant in ctx (all nil when none are set).
func (r Quotas) Get(ctx context.Context) (QuotaOverride, error) {
	var o QuotaOverride
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetTenantQuota(ctx, tid)
		if err != nil {
			if errdefs.IsNotFound(translate(err, "")) {
				return nil
			}
			return translate(err, "quota")
		}
		o = quotaFromRow(row)
		return nil
	})
	return o, err
}

// Set replaces the overrides of the tenant in ctx.
func (r Quotas) Set(ctx context.Context, o QuotaOverride) (QuotaOverride, error) {
	for _, v := range []*int32{o.ConcurrentSessions, o.ConcurrentSandboxes, o.CPUMillis, o.MemoryMiB, o.RequestsPerSecond, o.RequestBurst, o.FileStorageMiB} {
		if v != nil && *v <= 0 {
			return QuotaOverride{}, errdefs.InvalidArgument("quota limits must be above zero (leave a limit unset for the default)")
		}
	}
	if v := o.ModelTokensPerDay; v != nil && *v <= 0 {
		return QuotaOverride{}, errdefs.InvalidArgument("quota limits must be above zero (leave a limit unset for the default)")
	}
	var out QuotaOverride
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.UpsertTenantQuota(ctx, db.UpsertTenantQuotaParams{
			TenantID:            tid,
			ConcurrentSessions:  int4(o.ConcurrentSessions),
			ConcurrentSandboxes: int4(o.ConcurrentSandboxes),
			CpuMillis:           int4(o.CPUMillis),
			MemoryMib:           int4(o.MemoryMiB),
			RequestsPerSecond:   int4(o.RequestsPerSecond),
			RequestBurst:        int4(o.RequestBurst),
			FileStorageMib:      int4(o.FileStorageMiB),
			ModelTokensPerDay:   pgInt8(o.ModelTokensPerDay),
		})
		if err != nil {
			return translate(err, "quota of tenant "+tid)
		}
		out = quotaFromRow(row)
		return nil
	})
	return out, err
}

func int4(v *int32) pgtype.Int4 {
	if v == nil {
		return pgtype.Int4{}
	}
	return pgtype.Int4{Int32: *v, Valid: true}
}

func quotaFromRow(row db.TenantQuota) QuotaOverride {
	p := func(v pgtype.Int4) *int32 {
		if !v.Valid {
			return nil
		}
		return &v.Int32
	}
	return QuotaOverride{
		ConcurrentSessions:  p(row.ConcurrentSessions),
		ConcurrentSandboxes: p(row.ConcurrentSandboxes),
		CPUMillis:           p(row.CpuMillis),
		MemoryMiB:           p(row.MemoryMib),
		RequestsPerSecond:   p(row.RequestsPerSecond),
		RequestBurst:        p(row.RequestBurst),
		FileStorageMiB:      p(row.FileStorageMib),
		ModelTokensPerDay:   p8(row.ModelTokensPerDay),
	}
}

func pgInt8(v *int64) pgtype.Int8 {
	if v == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *v, Valid: true}
}

func p8(v pgtype.Int8) *int64 {
	if !v.Valid {
		return nil
	}
	return &v.Int64
}

// TokensToday returns the model tokens (input and output) the tenant in
// ctx's sessions have used this UTC day.
func (r Quotas) TokensToday(ctx context.Context) (int64, error) {
	var n int64
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		n, err = q.TenantTokensToday(ctx, tid)
		return translate(err, "token usage")
	})
	return n, err
}
