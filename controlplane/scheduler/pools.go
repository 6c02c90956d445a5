package scheduler

import (
	"cmp"
	"slices"
	"strings"

	"corral.dev/corral/policy"
)

// The host labels that placement reads (corral host --label pool=NAME,zone=a).
const (
	// PoolLabel names the host's pool (policy placement.yaml).
	PoolLabel = "pool"
	// ZoneLabel names the host's zone, which zone spread counts by.
	ZoneLabel = "zone"
)

// DedicatedWeight is the affinity ApplyPlacement gives the tenant's
// dedicated pools: above a warm sandbox, a present image and the fit
// together, so a dedicated host with room wins over a shared one.
const DedicatedWeight = 10_000

// poolAllowed reports whether h's pool is one of pools (none: any).
func poolAllowed(h *Host, pools []string) bool {
	return len(pools) == 0 || slices.Contains(pools, h.Labels[PoolLabel])
}

// ApplyPlacement fills r from its tenant's placement policy: the pools it
// may use, zone spread, and a preference for its dedicated pools. It
// replaces what r said of them before, so applying it twice changes
// nothing.
//
// The pools travel in the request, and from it in the plan, rather than
// the scheduler reading policy: a Raft replica re-plans and re-checks a
// plan from the log entry alone, so every replica decides the same even
// while the control-plane nodes' policy files differ.
func (r *Request) ApplyPlacement(p policy.Placement) {
	r.Pools = slices.Clone(p.Pools)
	r.SpreadZones = p.SpreadZones
	r.Affinity = slices.DeleteFunc(slices.Clone(r.Affinity), func(a Affinity) bool { return a.Key == PoolLabel && a.Weight == DedicatedWeight })
	for _, d := range p.Dedicated {
		r.Affinity = append(r.Affinity, Affinity{Key: PoolLabel, Value: d, Weight: DedicatedWeight})
	}
}

// PoolNames is pools as a person reads them: comma-separated, with "" as
// "hosts without a pool".
func PoolNames(pools []string) string {
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = cmp.Or(p, "hosts without a pool")
	}
	return strings.Join(names, ", ")
}

// leastZones returns, of the zones of cands (the hosts that can take a
// request), those that hold the fewest of the tenant's sandboxes, as
// count counts them over every host of a zone ("" is the hosts without a
// zone label). Only requests that ask for spread pay for it.
func leastZones(count func(zone string) int, cands []*Host) map[string]bool {
	n := map[string]int{}
	for _, h := range cands {
		z := h.Labels[ZoneLabel]
		if _, ok := n[z]; !ok {
			n[z] = count(z)
		}
	}
	least := -1
	for _, c := range n {
		if least < 0 || c < least {
			least = c
		}
	}
	out := make(map[string]bool, len(n))
	for z, c := range n {
		if c == least {
			out[z] = true
		}
	}
	return out
}

// fleetZones counts tenant's sandboxes by zone over hosts, for leastZones
// over a view without an Index: a pass over the hosts.
func fleetZones(v View, hosts []*Host, tenant string) func(string) int {
	byZone := map[string]int{}
	for _, h := range hosts {
		byZone[h.Labels[ZoneLabel]] += v.TenantSandboxes(h.ID, tenant)
	}
	return func(z string) int { return byZone[z] }
}
