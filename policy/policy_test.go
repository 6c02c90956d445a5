package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEmbeddedPolicyLoads(t *testing.T) {
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"admin", "developer", "viewer", "operator"} {
		if _, ok := p.Roles[role]; !ok {
			t.Errorf("role %s missing", role)
		}
	}
	if rt := p.Runtimes["process"]; !rt.TrustedOnly {
		t.Error("the process runtime must be trusted-only")
	}
	for _, name := range []string{"gvisor", "runc"} {
		if rt := p.Runtimes[name]; rt.DiskMiB <= 0 || rt.Pids <= 0 {
			t.Errorf("runtime %s ships without a disk or pids limit: %+v", name, rt)
		}
	}
	// Requests are small and below the limits, the hosts overcommit CPU
	// and memory but not disk, and no tenant may fill a host.
	for name, rt := range p.Runtimes {
		if rt.CPURequest() >= rt.CPUMillis || rt.MemoryRequest() >= rt.MemoryMiB {
			t.Errorf("runtime %s ships its limits as its requests: %+v", name, rt)
		}
	}
	if o := p.Overcommit; o.CPU <= 1 || o.Memory <= 1 || o.Disk != 1 {
		t.Errorf("overcommit %+v: want cpu and memory above 1, disk 1", o)
	}
	if s := p.DefaultQuota.HostSharePercent; s <= 0 || s >= 100 {
		t.Errorf("host_share_percent %d lets one tenant fill a host", s)
	}
	// An archived session's sandbox is kept an hour, as shipped or by
	// default; 0 releases it at once.
	if got := p.Runtimes["gvisor"].ArchiveReleaseAfter(); got != time.Hour {
		t.Errorf("gvisor archive_release_after_seconds: %v, want an hour", got)
	}
	if rt := p.Runtimes["process"]; rt.ArchiveReleaseAfterSeconds != nil || rt.ArchiveReleaseAfter() != DefaultArchiveReleaseAfter {
		t.Errorf("process without archive_release_after_seconds: %v", rt.ArchiveReleaseAfter())
	}
	zero := 0
	if got := (Runtime{ArchiveReleaseAfterSeconds: &zero}).ArchiveReleaseAfter(); got != 0 {
		t.Errorf("archive_release_after_seconds 0: %v, want at once", got)
	}
	if len(p.TrustedRuntimes) != 0 {
		t.Errorf("the shipped policy trusts tenants: %v", p.TrustedRuntimes)
	}
	if p.TenantTrusts("tenant_default", "runc") || !p.TenantTrusts("tenant_default", "gvisor") {
		t.Error("by default a tenant may use gvisor and not runc")
	}
	p.TrustedRuntimes = map[string][]string{"tenant_a": {"runc"}}
	if err := p.Validate(); err != nil || !p.TenantTrusts("tenant_a", "runc") || p.TenantTrusts("tenant_b", "runc") {
		t.Errorf("a tenant granted runc: err %v", err)
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
		{"admin", "api_keys", "write", true},
		{"admin", "audit", "read", true},
		{"admin", "tenants", "write", false}, // fleet action, tenant role
		{"admin", "hosts", "operate", false},
		{"developer", "sessions", "write", true},
		{"developer", "agents", "read", true},
		{"developer", "api_keys", "write", false},
		{"developer", "api_keys", "read", false},
		{"developer", "audit", "read", false},
		{"viewer", "agents", "read", true},
		{"viewer", "agents", "write", false},
		{"viewer", "sessions", "write", false},
		{"operator", "hosts", "operate", true},
		{"operator", "tenants", "write", true},
		{"operator", "tenant_keys", "write", true},
		{"operator", "agents", "read", false}, // tenant data, fleet role
		{"operator", "sessions", "write", false},
		{"fleet_viewer", "tenants", "read", true},
		{"fleet_viewer", "tenants", "write", false},
		{"admin", "agents", "delete", false}, // not a listed action
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
		"bad permission":       func(p *Policy) { p.Roles["x"] = Role{Scope: TenantScope, Permissions: []string{"agents"}} },
		"empty role":           func(p *Policy) { p.Roles["x"] = Role{Scope: TenantScope} },
		"no scope":             func(p *Policy) { p.Roles["x"] = Role{Permissions: []string{"agents:read"}} },
		"unknown action":       func(p *Policy) { p.Roles["x"] = Role{Scope: TenantScope, Permissions: []string{"agents:launch"}} },
		"unknown resource":     func(p *Policy) { p.Roles["x"] = Role{Scope: TenantScope, Permissions: []string{"rockets:*"}} },
		"fleet action, tenant": func(p *Policy) { p.Roles["x"] = Role{Scope: TenantScope, Permissions: []string{"hosts:operate"}} },
		"tenant action, fleet": func(p *Policy) { p.Roles["x"] = Role{Scope: FleetScope, Permissions: []string{"sessions:read"}} },
		"wildcard action":      func(p *Policy) { p.Actions.Tenant = append(p.Actions.Tenant, "agents:*") },
		"duplicate action":     func(p *Policy) { p.Actions.Fleet = append(p.Actions.Fleet, "agents:read") },
		"zero quota":           func(p *Policy) { p.DefaultQuota.MemoryMiB = 0 },
		"zero sessions":        func(p *Policy) { p.DefaultQuota.ConcurrentSessions = 0 },
		"zero rate":            func(p *Policy) { p.DefaultQuota.RequestsPerSecond = 0 },
		"unbounded output":     func(p *Policy) { r := p.Runtimes["gvisor"]; r.OutputLimitBytes = 0; p.Runtimes["gvisor"] = r },
		"no gvisor":            func(p *Policy) { delete(p.Runtimes, "gvisor") },
		"pool of process":      func(p *Policy) { p.Pools = append(p.Pools, Pool{Runtime: "process", Image: "x", Max: 1}) },
		"pool without image":   func(p *Policy) { p.Pools = append(p.Pools, Pool{Runtime: "runc", Max: 1}) },
		"pool min over max":    func(p *Policy) { p.Pools = append(p.Pools, Pool{Runtime: "runc", Image: "x", Min: 3, Max: 2}) },
		"pool too big":         func(p *Policy) { p.Pools = append(p.Pools, Pool{Runtime: "runc", Image: "x", Max: MaxPoolSize + 1}) },
		"pool listed twice":    func(p *Policy) { p.Pools = append(p.Pools, p.Pools[0]) },
		"pool of no runtime":   func(p *Policy) { p.Pools = append(p.Pools, Pool{Runtime: "kata", Image: "x", Max: 1}) },
		"unbounded disk":       func(p *Policy) { r := p.Runtimes["gvisor"]; r.DiskMiB = 0; p.Runtimes["gvisor"] = r },
		"unbounded pids":       func(p *Policy) { r := p.Runtimes["runc"]; r.Pids = 0; p.Runtimes["runc"] = r },
		"default over max": func(p *Policy) {
			r := p.Runtimes["gvisor"]
			r.DefaultExecTimeoutSeconds = 601
			p.Runtimes["gvisor"] = r
		},
		"process claims disk": func(p *Policy) { r := p.Runtimes["process"]; r.DiskMiB = 10; p.Runtimes["process"] = r },
		"trust not a tenant":  func(p *Policy) { p.TrustedRuntimes = map[string][]string{"acme": {"runc"}} },
		"trust gvisor":        func(p *Policy) { p.TrustedRuntimes = map[string][]string{"tenant_a": {"gvisor"}} },
		"trust process":       func(p *Policy) { p.TrustedRuntimes = map[string][]string{"tenant_a": {"process"}} },
		"cpu request over limit": func(p *Policy) {
			r := p.Runtimes["gvisor"]
			r.CPURequestMillis = r.CPUMillis + 1
			p.Runtimes["gvisor"] = r
		},
		"negative memory request": func(p *Policy) { r := p.Runtimes["runc"]; r.MemoryRequestMiB = -1; p.Runtimes["runc"] = r },
		"overcommit below one":    func(p *Policy) { p.Overcommit.CPU = 0.5 },
		"overcommit unbounded":    func(p *Policy) { p.Overcommit.Memory = MaxOvercommit + 1 },
		"host share over 100":     func(p *Policy) { p.DefaultQuota.HostSharePercent = 101 },
		"negative host share":     func(p *Policy) { p.DefaultQuota.HostSharePercent = -1 },
		"negative archive release": func(p *Policy) {
			r, n := p.Runtimes["runc"], -1
			r.ArchiveReleaseAfterSeconds = &n
			p.Runtimes["runc"] = r
		},
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

// An operator's policy directory is validated like the embedded one: a role
// naming an action nobody defined refuses to load, and so start-up fails.
func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"roles.yaml", "quotas.yaml", "runtimes.yaml"} {
		b, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadDir(dir); err != nil {
		t.Fatalf("a copy of the embedded policy: %v", err)
	}
	roles, _ := files.ReadFile("roles.yaml")
	bad := strings.Replace(string(roles), "      - quotas:read\n  viewer:", "      - quotas:read\n      - rockets:launch\n  viewer:", 1)
	if bad == string(roles) {
		t.Fatal("the test's edit did not apply")
	}
	if err := os.WriteFile(filepath.Join(dir, "roles.yaml"), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "rockets:launch") {
		t.Fatalf("unknown action: err = %v", err)
	}
	if _, err := LoadDir(t.TempDir()); err == nil {
		t.Fatal("an empty directory loaded")
	}
}
