package authz

import (
	"testing"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

func TestCheck(t *testing.T) {
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	z, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	both := Rule{Tenant: A("api_keys", "write"), Fleet: A("tenant_keys", "write")}
	tenantOnly := Rule{Tenant: A("sessions", "write")}
	fleetOnly := Rule{Fleet: A("hosts", "operate")}
	tenantP := func(roles ...string) auth.Principal {
		return auth.Principal{Subject: "t", Tenant: "tenant_a", Roles: roles}
	}
	fleetP := func(roles ...string) auth.Principal { return auth.Principal{Subject: "f", Roles: roles} }
	tests := []struct {
		name string
		p    auth.Principal
		r    Rule
		ok   bool
	}{
		{"tenant admin, own keys", tenantP("admin"), both, true},
		{"tenant developer, keys", tenantP("developer"), both, false},
		{"operator, a tenant's keys", fleetP("operator"), both, true},
		{"fleet viewer, a tenant's keys", fleetP("fleet_viewer"), both, false},
		{"developer, sessions", tenantP("developer"), tenantOnly, true},
		{"viewer, sessions", tenantP("viewer"), tenantOnly, false},
		{"operator, tenant data", fleetP("operator"), tenantOnly, false},
		{"tenant key naming operator, fleet", tenantP("operator"), fleetOnly, false},
		// An environment key: a worker's routes only, whatever roles it
		// were given.
		{"environment key, a worker's route", auth.Principal{Subject: "e", Tenant: "tenant_a", EnvironmentID: "env_a"}, Rule{Tenant: A("sessions", "read"), Worker: true}, true},
		{"environment key, another route", auth.Principal{Subject: "e", Tenant: "tenant_a", EnvironmentID: "env_a"}, tenantOnly, false},
		{"environment key with roles, another route", auth.Principal{Subject: "e", Tenant: "tenant_a", EnvironmentID: "env_a", Roles: []string{"admin"}}, both, false},
		{"tenant admin, a worker's route", tenantP("admin"), Rule{Tenant: A("sessions", "read"), Worker: true}, true},
		{"viewer, a worker's write route", tenantP("viewer"), Rule{Tenant: A("environments", "write"), Worker: true}, false},
		{"tenant key naming operator, tenant data", tenantP("operator"), tenantOnly, false},
		{"fleet key naming admin, tenant data", fleetP("admin"), tenantOnly, false},
		{"operator, hosts", fleetP("operator"), fleetOnly, true},
		{"no roles", tenantP(), tenantOnly, false},
		{"unknown role", tenantP("root"), tenantOnly, false},
		{"empty rule", fleetP("operator"), Rule{}, false},
	}
	for _, tt := range tests {
		err := z.Check(tt.p, tt.r)
		if (err == nil) != tt.ok {
			t.Errorf("%s: Check = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && errdefs.KindOf(err) != errdefs.PermissionDeniedKind {
			t.Errorf("%s: kind %v, want permission denied", tt.name, errdefs.KindOf(err))
		}
	}
}

func TestMethodRule(t *testing.T) {
	tests := map[string]bool{
		"/corral.admin.v1.ClusterService/GetStatus":    true,
		"/corral.admin.v1.ClusterService/Drain":        true, // the service's wildcard
		"/corral.admin.v1.HostsService/ListHosts":      true,
		"/corral.admin.v1.TenantsService/CreateTenant": true,
		"/corral.admin.v1.TenantsService/Nope":         false, // no wildcard for tenants
		"/grpc.health.v1.Health/Check":                 false,
		"nonsense":                                     false,
		"":                                             false,
	}
	for m, want := range tests {
		if _, ok := MethodRule(m); ok != want {
			t.Errorf("MethodRule(%q) ok = %v, want %v", m, ok, want)
		}
	}
	if r, _ := MethodRule("/corral.admin.v1.HostsService/Drain"); r.Fleet != A("hosts", "operate") || r.Tenant != (Action{}) {
		t.Errorf("hosts methods need a fleet operator: %+v", r)
	}
}

// A rule naming an action the policy does not list fails start-up.
func TestNewRefusesUnknownActions(t *testing.T) {
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	Methods["/test.Svc/M"] = Rule{Fleet: A("rockets", "launch")}
	defer delete(Methods, "/test.Svc/M")
	if _, err := New(p); err == nil {
		t.Fatal("New accepted a rule with an unknown action")
	}
}
