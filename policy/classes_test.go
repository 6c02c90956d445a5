package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadClasses loads the embedded policy with classes.yaml replaced by
// yaml, and quotas.yaml's trusted_runtimes by trusted.
func loadClasses(t *testing.T, yaml, trusted string) (*Policy, error) {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"roles.yaml", "quotas.yaml", "runtimes.yaml", PlacementFile} {
		b, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "quotas.yaml" && trusted != "" {
			b = []byte(strings.Replace(string(b), "trusted_runtimes: {}", trusted, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if yaml != "" {
		if err := os.WriteFile(filepath.Join(dir, ClassesFile), []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return LoadDir(dir)
}

// The shipped classes are one per runtime profile, as a policy without
// classes.yaml has: the behaviour before classes.
func TestShippedClassesAreTheRuntimes(t *testing.T) {
	shipped, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	absent, err := loadClasses(t, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []*Policy{shipped, absent} {
		if len(p.SandboxClasses) != len(p.Runtimes) {
			t.Fatalf("classes %v, want one per runtime %v", p.SandboxClasses, p.Runtimes)
		}
		for name, rt := range p.Runtimes {
			c, prof, ok := p.ClassProfile(name)
			// The shipped gvisor and runc classes allow limited networking
			// (egress); without classes.yaml none does.
			limited := i == 0 && name != ProcessRuntime
			if !ok || c.Runtime != name || c.Provider() != name || prof != rt || !c.AllowsNetwork(NetworkNone) || c.AllowsNetwork(NetworkLimited) != limited {
				t.Fatalf("class %s: %+v %+v, want runtime %s's profile unchanged, network limited %v", name, c, prof, name, limited)
			}
		}
		// Anyone may use gvisor; runc needs a grant; process only as the
		// node's default.
		for _, c := range []struct {
			class, nodeDefault string
			want               bool
		}{{"gvisor", "gvisor", true}, {"runc", "gvisor", false}, {"process", "gvisor", false}, {"process", "process", true}, {"nope", "gvisor", false}} {
			if got := p.TenantMayUseClass("tenant_x", c.class, c.nodeDefault); got != c.want {
				t.Errorf("tenant_x may use %s on a %s node: %v, want %v", c.class, c.nodeDefault, got, c.want)
			}
		}
		if d := p.TenantDefaultClass("tenant_x", "gvisor"); d != "gvisor" {
			t.Fatalf("default class %s, want the node's", d)
		}
	}
}

const fleetClasses = `
sandbox_classes:
  gvisor: {runtime: gvisor}
  big: {runtime: gvisor, image: localhost/big:1, cpu_millis: 4000, memory_mib: 4096, network_modes: [none]}
  trusted: {runtime: runc, cpu_request_millis: 200}
  process: {runtime: process}
tenant_classes:
  tenant_acme: {classes: [gvisor, big, trusted], default: big}
  tenant_dev: {classes: [process, gvisor]}
`

func TestClasses(t *testing.T) {
	p, err := loadClasses(t, fleetClasses, "trusted_runtimes:\n  tenant_acme: [runc]")
	if err != nil {
		t.Fatal(err)
	}
	c, prof, ok := p.ClassProfile("big")
	if !ok || c.Image != "localhost/big:1" || prof.CPUMillis != 4000 || prof.MemoryMiB != 4096 || prof.CPURequest() != p.Runtimes["gvisor"].CPURequest() || prof.Pids != p.Runtimes["gvisor"].Pids {
		t.Fatalf("big: %+v %+v, want gvisor's profile with 4000m and 4096 MiB", c, prof)
	}
	if _, prof, _ := p.ClassProfile("trusted"); prof.CPURequest() != 200 || prof.TrustedOnly != true {
		t.Fatalf("trusted: %+v", prof)
	}
	for _, c := range []struct {
		tenant, class string
		want          bool
	}{
		{"tenant_acme", "big", true}, {"tenant_acme", "trusted", true}, {"tenant_acme", "process", false},
		{"tenant_dev", "process", true}, {"tenant_dev", "big", false},
		{"tenant_other", "big", true}, {"tenant_other", "trusted", false}, {"tenant_other", "process", false},
	} {
		if got := p.TenantMayUseClass(c.tenant, c.class, "gvisor"); got != c.want {
			t.Errorf("%s may use %s: %v, want %v", c.tenant, c.class, got, c.want)
		}
	}
	for tenant, want := range map[string]string{"tenant_acme": "big", "tenant_dev": "gvisor", "tenant_other": "gvisor"} {
		if got := p.TenantDefaultClass(tenant, "gvisor"); got != want {
			t.Errorf("%s's default class %s, want %s", tenant, got, want)
		}
	}
	if got := p.TenantDefaultClass("tenant_dev", "runc"); got != "process" {
		t.Errorf("tenant_dev's default on a runc node %s, want its first class", got)
	}
}

func TestClassesRefused(t *testing.T) {
	for _, c := range []struct{ name, yaml, trusted, want string }{
		{"no runtime", "sandbox_classes: {a: {}}", "", "names no runtime"},
		{"unknown runtime", "sandbox_classes: {a: {runtime: kata}}", "", `runtime "kata" has no profile`},
		{"bad name", "sandbox_classes: {A: {runtime: gvisor}}", "", "not a class name"},
		{"process image", "sandbox_classes: {a: {runtime: process, image: x}}", "", "runs no image"},
		{"process pids", "sandbox_classes: {a: {runtime: process, pids: 10}}", "", "enforces no pids"},
		{"request over limit", "sandbox_classes: {a: {runtime: gvisor, cpu_request_millis: 5000}}", "", "a request is from 1 to its limit"},
		{"negative", "sandbox_classes: {a: {runtime: gvisor, disk_mib: -1}}", "", "negative"},
		{"unrestricted network", "sandbox_classes: {a: {runtime: gvisor, network_modes: [none, unrestricted]}}", "", "unrestricted is not offered"},
		{"unknown network", "sandbox_classes: {a: {runtime: gvisor, network_modes: [open]}}", "", `unknown network mode "open"`},
		{"unknown field", "sandbox_classes: {a: {runtime: gvisor, provider: kvm}}", "", "field provider not found"},
		{"tenant id", "sandbox_classes: {a: {runtime: gvisor}}\ntenant_classes: {acme: {classes: [a]}}", "", "not a tenant id"},
		{"no classes", "sandbox_classes: {a: {runtime: gvisor}}\ntenant_classes: {tenant_a: {}}", "", "lists no class"},
		{"unknown class", "sandbox_classes: {a: {runtime: gvisor}}\ntenant_classes: {tenant_a: {classes: [b]}}", "", `class "b" is not in sandbox_classes`},
		{"twice", "sandbox_classes: {a: {runtime: gvisor}}\ntenant_classes: {tenant_a: {classes: [a, a]}}", "", "listed twice"},
		{"default not listed", "sandbox_classes: {a: {runtime: gvisor}, b: {runtime: gvisor}}\ntenant_classes: {tenant_a: {classes: [a], default: b}}", "", `default "b" is not one of its classes`},
		{"trusted not granted", "sandbox_classes: {t: {runtime: runc}}\ntenant_classes: {tenant_a: {classes: [t]}}", "", "do not grant"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadClasses(t, c.yaml, c.trusted)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
		})
	}
}
