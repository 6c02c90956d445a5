package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// loadPlacement loads the embedded policy with placement.yaml replaced by
// yaml.
func loadPlacement(t *testing.T, yaml string) (*Policy, error) {
	t.Helper()
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
	if err := os.WriteFile(filepath.Join(dir, PlacementFile), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return LoadDir(dir)
}

const fleetPools = `
host_pools:
  shared: {shared: true}
  batch: {}
  dedicated: {tenant: tenant_acme}
tenant_placement:
  tenant_acme: {spread_zones: true}
  tenant_bound: {pools: [batch]}
`

// The shipped policy defines no pools: every tenant may use every host.
func TestShippedPlacementDefinesNoPools(t *testing.T) {
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.HostPools) != 0 || len(p.TenantPlacement) != 0 {
		t.Fatalf("the shipped placement.yaml defines pools or bindings: %v %v", p.HostPools, p.TenantPlacement)
	}
	if pl := p.PlacementOf("tenant_default"); pl.Pools != nil || pl.SpreadZones {
		t.Fatalf("placement without pools: %+v, want no pool filter", pl)
	}
	// An empty placement.yaml (comments only) is the same.
	if p, err := loadPlacement(t, "# nothing\n"); err != nil || len(p.HostPools) != 0 {
		t.Fatalf("an empty placement.yaml: %v", err)
	}
}

func TestPlacementOf(t *testing.T) {
	p, err := loadPlacement(t, fleetPools)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant    string
		pools     []string
		dedicated []string
		spread    bool
	}{
		// Unbound: the shared pools and the hosts without a pool; its own
		// dedicated pool too, and preferred.
		{"tenant_acme", []string{"", "dedicated", "shared"}, []string{"dedicated"}, true},
		{"tenant_other", []string{"", "shared"}, nil, false},
		// Bound: those pools only.
		{"tenant_bound", []string{"batch"}, nil, false},
	} {
		got := p.PlacementOf(tc.tenant)
		if !slices.Equal(got.Pools, tc.pools) || !slices.Equal(got.Dedicated, tc.dedicated) || got.SpreadZones != tc.spread {
			t.Errorf("%s: %+v, want pools %q dedicated %q spread %v", tc.tenant, got, tc.pools, tc.dedicated, tc.spread)
		}
	}
}

// Bindings that cannot hold refuse to load, with an error that says why.
func TestPlacementValidation(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown pool", "host_pools: {shared: {shared: true}}\ntenant_placement: {tenant_a: {pools: [gpu]}}\n", `pool "gpu" is not in host_pools`},
		{"dedicated to two tenants", "host_pools: {dedicated: {tenant: tenant_acme}}\ntenant_placement: {tenant_b: {pools: [dedicated]}}\n",
			"pool dedicated is dedicated to tenant_acme; a dedicated pool has one tenant"},
		{"shared and dedicated", "host_pools: {p: {shared: true, tenant: tenant_a}}\n", "both shared and dedicated"},
		{"not a tenant id", "host_pools: {p: {tenant: acme}}\n", `"acme" is not a tenant id`},
		{"binding of no tenant", "host_pools: {p: {}}\ntenant_placement: {acme: {pools: [p]}}\n", `"acme" is not a tenant id`},
		{"bad pool name", "host_pools: {\"Big Pool\": {shared: true}}\n", "is not a pool name"},
		{"pools without host_pools", "tenant_placement: {tenant_a: {pools: [p]}}\n", "host_pools defines none"},
		{"listed twice", "host_pools: {p: {}}\ntenant_placement: {tenant_a: {pools: [p, p]}}\n", "listed twice"},
		{"unknown field", "host_pools: {p: {dedicated: tenant_a}}\n", "dedicated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadPlacement(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
	// A dedicated pool's own tenant may name it in its binding.
	if _, err := loadPlacement(t, "host_pools: {dedicated: {tenant: tenant_acme}, shared: {shared: true}}\ntenant_placement: {tenant_acme: {pools: [dedicated]}}\n"); err != nil {
		t.Fatal(err)
	}
}
