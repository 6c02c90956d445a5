// Package authz decides whether a principal may do an action: every public
// route and every admin gRPC method names a Rule (the tables live beside the
// routes in publicapi and, for gRPC, in Methods below), and Check compares it
// with the principal's roles through policy/.
//
// A rule has up to two actions: the one a tenant principal needs (on its own
// tenant's data) and the one a fleet principal needs. A tenant principal is
// judged only by the tenant action and a fleet principal only by the fleet
// action, so an operator never reaches tenant data, and a tenant key that
// names a fleet role gains nothing. A method with no rule is refused. An
// environment key (a self-hosted worker's) has no roles and may call only
// the rules marked Worker.
package authz

import (
	"strings"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// Action is one "resource:verb" of policy/roles.yaml.
type Action struct{ Resource, Verb string }

// A constructs an action.
func A(resource, verb string) Action { return Action{resource, verb} }

func (a Action) String() string {
	if a.Resource == "" {
		return ""
	}
	return a.Resource + ":" + a.Verb
}

// IsWrite reports whether the action changes something (audited on
// success as well as on refusal).
func (a Action) IsWrite() bool { return a.Verb != "" && a.Verb != "read" }

// Rule says which action each kind of principal needs. A zero action means
// that kind of principal may not call at all.
type Rule struct {
	Tenant Action
	Fleet  Action
	// Worker lets an environment key (auth.Principal.EnvironmentID) call
	// the route: one a self-hosted worker needs. Its handler confines the
	// key to its environment. An environment key is judged by this alone:
	// it has no roles.
	Worker bool
}

// For returns the action p is judged by under r.
func (r Rule) For(p auth.Principal) Action {
	if p.Fleet() {
		return r.Fleet
	}
	return r.Tenant
}

// Authorizer checks rules against the policy.
type Authorizer struct{ p *policy.Policy }

// New returns an Authorizer over p. It refuses a policy that lacks an
// action some rule in Methods names (a typo in the table fails start-up).
func New(p *policy.Policy) (*Authorizer, error) {
	for m, r := range Methods {
		for _, a := range []Action{r.Tenant, r.Fleet} {
			if a.Resource == "" {
				continue
			}
			if _, ok := p.ScopeOf(a.Resource, a.Verb); !ok {
				return nil, errdefs.InvalidArgument("authz: method %s needs %s, which policy/roles.yaml does not list", m, a)
			}
		}
	}
	return &Authorizer{p: p}, nil
}

// Policy returns the policy the authorizer checks against.
func (z *Authorizer) Policy() *policy.Policy { return z.p }

// Check returns nil if p may do what r asks of it, else a permission denied.
func (z *Authorizer) Check(p auth.Principal, r Rule) error {
	if p.EnvironmentID != "" {
		if r.Worker {
			return nil
		}
		return errdefs.PermissionDenied("%s is an environment key: it serves only its environment's work queue and sessions", p.Subject)
	}
	a := r.For(p)
	if a.Resource == "" {
		if p.Fleet() {
			return errdefs.PermissionDenied("fleet principals cannot do this; it needs a principal of a tenant")
		}
		return errdefs.PermissionDenied("this needs a fleet operator")
	}
	for _, role := range p.Roles {
		if z.p.Allows(role, a.Resource, a.Verb) {
			return nil
		}
	}
	return errdefs.PermissionDenied("%s needs permission %s, which none of its roles (%s) grants", p.Subject, a, strings.Join(p.Roles, ", "))
}

// Allowed reports whether any of roles grants a (for tests and listings).
func (z *Authorizer) Allowed(roles []string, a Action) bool {
	for _, role := range roles {
		if z.p.Allows(role, a.Resource, a.Verb) {
			return true
		}
	}
	return false
}
