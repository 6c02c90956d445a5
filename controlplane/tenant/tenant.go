// Package tenant carries the calling tenant through a context. Every
// tenant-owned read or write starts from tenant.Required(ctx); the store turns
// it into the per-transaction setting that row-level security keys on.
//
// Package auth puts the tenant of the authenticated principal here; nothing
// else does for a request.
package tenant

import (
	"context"
	"strings"

	"corral.dev/corral/internal/errdefs"
)

// ID identifies a tenant. IDs are stable, opaque strings.
type ID string

// Default is the built-in tenant the first migration creates (corral dev's
// key belongs to it).
const Default ID = "tenant_default"

type ctxKey struct{}

// With returns ctx carrying tenant id.
func With(ctx context.Context, id ID) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// From returns the tenant in ctx, if any.
func From(ctx context.Context) (ID, bool) {
	id, ok := ctx.Value(ctxKey{}).(ID)
	return id, ok && id != ""
}

// Required returns the tenant in ctx, or an error of kind unauthenticated:
// tenant-owned data is never touched without one.
func Required(ctx context.Context) (ID, error) {
	id, ok := From(ctx)
	if !ok {
		return "", errdefs.Unauthenticated("no tenant in request context")
	}
	return id, nil
}

// Validate reports whether id is a well-formed tenant id.
func (id ID) Validate() error {
	s := string(id)
	if !strings.HasPrefix(s, "tenant_") || len(s) > 64 {
		return errdefs.InvalidArgument("tenant id %q: want tenant_ followed by at most 57 characters", s)
	}
	for _, r := range s[len("tenant_"):] {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r >= 'A' && r <= 'Z') {
			return errdefs.InvalidArgument("tenant id %q: only letters, digits, _ and - are allowed", s)
		}
	}
	return nil
}
