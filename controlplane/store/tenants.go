package store

import (
	"context"
	"time"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
)

// Tenant is a tenant as the rest of corral sees it.
type Tenant struct {
	ID        tenant.ID
	Name      string
	CreatedAt time.Time
}

// Tenants reads tenants. A caller sees only its own tenant.
type Tenants struct{ s *Store }

// Tenants returns the tenant repository.
func (s *Store) Tenants() Tenants { return Tenants{s} }

// Current returns the tenant in ctx.
func (r Tenants) Current(ctx context.Context) (Tenant, error) {
	id, err := tenant.Required(ctx)
	if err != nil {
		return Tenant{}, err
	}
	var t Tenant
	err = r.s.inTenant(ctx, func(q *db.Queries) error {
		row, err := q.GetTenant(ctx, string(id))
		if err != nil {
			return translate(err, "tenant "+string(id))
		}
		t = Tenant{ID: tenant.ID(row.ID), Name: row.Name, CreatedAt: row.CreatedAt.Time}
		return nil
	})
	return t, err
}
