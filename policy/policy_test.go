package policy

import (
	"strings"
	"testing"
)

func TestEmbeddedPolicyLoads(t *testing.T) {
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"admin", "developer", "viewer"} {
		if _, ok := p.Roles[role]; !ok {
			t.Errorf("role %s missing", role)
		}
	}
	if rt := p.Runtimes["process"]; !rt.TrustedOnly {
		t.Error("the process runtime must be trusted-only")
	}
}

func TestAllows(t *testing.T) {
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		role, resource, verb string
		want                 bool
	}{
		{"admin", "api_keys", "create", true},
		{"developer", "sessions", "create", true},
		{"developer", "api_keys", "create", false},
		{"developer", "vaults", "read", true},
		{"developer", "vaults", "write", false},
		{"viewer", "agents", "read", true},
		{"viewer", "agents", "create", false},
		{"nobody", "agents", "read", false},
	}
	for _, tt := range tests {
		if got := p.Allows(tt.role, tt.resource, tt.verb); got != tt.want {
			t.Errorf("Allows(%s, %s, %s) = %v, want %v", tt.role, tt.resource, tt.verb, got, tt.want)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	good := func() *Policy {
		p, err := Load()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := map[string]func(*Policy){
		"bad permission":   func(p *Policy) { p.Roles["x"] = Role{Permissions: []string{"agents"}} },
		"empty role":       func(p *Policy) { p.Roles["x"] = Role{} },
		"zero quota":       func(p *Policy) { p.DefaultQuota.MemoryMiB = 0 },
		"unbounded output": func(p *Policy) { r := p.Runtimes["gvisor"]; r.OutputLimitBytes = 0; p.Runtimes["gvisor"] = r },
		"no gvisor":        func(p *Policy) { delete(p.Runtimes, "gvisor") },
	}
	for name, mutate := range tests {
		p := good()
		mutate(p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
	}
	var p Policy
	if err := decodeStrict([]byte("roles:\n  a:\n    permisions: []\n"), &p); err == nil || !strings.Contains(err.Error(), "permisions") {
		t.Errorf("a misspelt key must be refused, got %v", err)
	}
}
