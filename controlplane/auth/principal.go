package auth

import (
	"context"

	"corral.dev/corral/controlplane/tenant"
)

// How a principal proved who it is.
const (
	MethodAPIKey = "api_key"
	MethodOIDC   = "oidc"
)

// Principal is an authenticated caller.
type Principal struct {
	// Subject names the caller in the audit log and in errors:
	// "<kind>:<name> (<principal id>)" for a tenant's users and service
	// principals, or the operator key's principal.
	Subject string
	// PrincipalID is the tenant principal's record (store.Principal); empty
	// for operators.
	PrincipalID string
	// Tenant is the caller's tenant; empty for fleet principals (operators).
	Tenant tenant.ID
	// Roles are the caller's roles (policy/roles.yaml).
	Roles  []string
	Method string
	// KeyID is the API key's id, when Method is MethodAPIKey.
	KeyID string
	// EnvironmentID is set for an environment key: the self-hosted
	// environment whose worker it authenticates. Such a principal has no
	// roles; authz lets it call only the routes a worker needs, and their
	// handlers only for this environment.
	EnvironmentID string
}

// subject names a tenant principal ("<kind>:<name>") with its record's id,
// for the audit log and errors.
func subject(principal, id string) string { return principal + " (" + id + ")" }

// Fleet reports whether p acts on the fleet rather than within a tenant.
func (p Principal) Fleet() bool { return p.Tenant == "" }

type ctxKey struct{}

// With returns ctx carrying p, and p's tenant (if any) for the store.
func With(ctx context.Context, p Principal) context.Context {
	ctx = context.WithValue(ctx, ctxKey{}, p)
	if p.Tenant != "" {
		ctx = tenant.With(ctx, p.Tenant)
	}
	return ctx
}

// From returns the principal in ctx, if any.
func From(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}
