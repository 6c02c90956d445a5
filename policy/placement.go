package policy

import (
	"fmt"
	"slices"
	"strings"
)

// PlacementFile is the optional policy file of host pools and of where each
// tenant's sandboxes may go. A policy directory without it defines no host
// pools: every tenant may use every host, as before pools existed.
const PlacementFile = "placement.yaml"

// HostPool is a pool of hosts: the hosts started with --label pool=NAME.
//
// A pool is shared (every tenant without a binding of its own may use it),
// dedicated (its Tenant, and no other, may use it) or neither (only the
// tenants whose binding names it may use it).
type HostPool struct {
	Description string `yaml:"description"`
	Shared      bool   `yaml:"shared"`
	// Tenant, when set, dedicates the pool to that tenant: no other
	// tenant's sandbox is ever placed on its hosts.
	Tenant string `yaml:"tenant"`
}

// TenantPlacement is one tenant's binding (tenant_placement).
type TenantPlacement struct {
	// Pools, when set, are the pools the tenant's sandboxes may use,
	// replacing the default (the shared pools and the hosts without a
	// pool). The tenant's dedicated pools are always among them.
	Pools []string `yaml:"pools"`
	// SpreadZones spreads the tenant's sandboxes over the zones (the
	// hosts' zone label): each goes to a zone that holds the fewest of
	// them.
	SpreadZones bool `yaml:"spread_zones"`
}

// Placement is what the policy says of where one tenant's sandboxes may
// go (PlacementOf).
type Placement struct {
	// Pools are the pools the tenant may use, sorted; "" stands for the
	// hosts without a pool label. Nil when the policy defines no pools:
	// every host may take the tenant's sandboxes.
	Pools []string
	// Dedicated are the pools dedicated to the tenant, sorted: its
	// sandboxes prefer them.
	Dedicated []string
	// SpreadZones asks for the tenant's sandboxes to be spread over zones.
	SpreadZones bool
}

// PlacementOf returns where a tenant's sandboxes may go.
func (p *Policy) PlacementOf(tenantID string) Placement {
	bound, hasBinding := p.TenantPlacement[tenantID]
	pl := Placement{SpreadZones: bound.SpreadZones}
	if len(p.HostPools) == 0 {
		return pl
	}
	allowed := map[string]bool{}
	if hasBinding && len(bound.Pools) > 0 {
		for _, name := range bound.Pools {
			allowed[name] = true
		}
	} else {
		allowed[""] = true // hosts without a pool stay shared
		for name, hp := range p.HostPools {
			if hp.Shared {
				allowed[name] = true
			}
		}
	}
	for name, hp := range p.HostPools {
		if hp.Tenant == tenantID {
			allowed[name] = true
			pl.Dedicated = append(pl.Dedicated, name)
		}
	}
	for name := range allowed {
		pl.Pools = append(pl.Pools, name)
	}
	slices.Sort(pl.Pools)
	slices.Sort(pl.Dedicated)
	return pl
}

// validatePlacement checks the host pools and the tenants' bindings: a
// pool is shared or dedicated, not both; a binding names pools that exist
// and no other tenant's dedicated pool.
func (p *Policy) validatePlacement() error {
	for _, name := range sortedKeys(p.HostPools) {
		hp := p.HostPools[name]
		switch {
		case !poolName.MatchString(name):
			return fmt.Errorf("host_pools: %q is not a pool name (lower case letters, digits, - and _, at most 63)", name)
		case hp.Shared && hp.Tenant != "":
			return fmt.Errorf("host_pools: pool %s is both shared and dedicated to %s", name, hp.Tenant)
		case hp.Tenant != "" && !strings.HasPrefix(hp.Tenant, "tenant_"):
			return fmt.Errorf("host_pools: pool %s: %q is not a tenant id (tenant_...)", name, hp.Tenant)
		}
	}
	for _, id := range sortedKeys(p.TenantPlacement) {
		if !strings.HasPrefix(id, "tenant_") {
			return fmt.Errorf("tenant_placement: %q is not a tenant id (tenant_...)", id)
		}
		b := p.TenantPlacement[id]
		if len(b.Pools) > 0 && len(p.HostPools) == 0 {
			return fmt.Errorf("tenant_placement: tenant %s is bound to pools %v, but host_pools defines none", id, b.Pools)
		}
		seen := map[string]bool{}
		for _, name := range b.Pools {
			hp, ok := p.HostPools[name]
			switch {
			case !ok:
				return fmt.Errorf("tenant_placement: tenant %s: pool %q is not in host_pools", id, name)
			case hp.Tenant != "" && hp.Tenant != id:
				return fmt.Errorf("tenant_placement: tenant %s: pool %s is dedicated to %s; a dedicated pool has one tenant", id, name, hp.Tenant)
			case seen[name]:
				return fmt.Errorf("tenant_placement: tenant %s: pool %s is listed twice", id, name)
			}
			seen[name] = true
		}
	}
	return nil
}
