// Package schedulertest builds fleet views for scheduler tests and records the
// plans a test makes, committing them the way the leader's applier does.
package schedulertest

import (
	"fmt"
	"sort"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
)

// View is an in-memory scheduler.View that keeps a scheduler.Index of its
// hosts (scheduler.Indexed), as the FSM's view does. A test that changes a
// host in place (View.Host returns the pointer) calls Reindex before it
// places; Harness.Place does.
type View struct {
	hosts      map[string]*scheduler.Host
	sorted     []*scheduler.Host // hosts in id order
	index      *scheduler.Index
	placements map[string]scheduler.Placement
	usage      map[string]scheduler.Usage
	// TenantQuota is every tenant's quota (Harness sets it to its Quota).
	TenantQuota scheduler.Quota
}

var _ scheduler.Indexed = (*View)(nil)

// NewView returns a view holding hosts.
func NewView(hosts ...scheduler.Host) *View {
	v := &View{hosts: map[string]*scheduler.Host{}, index: scheduler.NewIndex(), placements: map[string]scheduler.Placement{}, usage: map[string]scheduler.Usage{}}
	for _, h := range hosts {
		v.AddHost(h)
	}
	return v
}

// AddHost adds or replaces a host.
func (v *View) AddHost(h scheduler.Host) {
	v.hosts[h.ID] = &h
	v.index.Update(&h)
	v.sorted = v.sorted[:0]
	for _, h := range v.hosts {
		v.sorted = append(v.sorted, h)
	}
	sort.Slice(v.sorted, func(i, j int) bool { return v.sorted[i].ID < v.sorted[j].ID })
}

// Index implements scheduler.Indexed.
func (v *View) Index() *scheduler.Index { return v.index }

// Reindex files every host again, after a test changed hosts in place: a
// pass over the fleet.
func (v *View) Reindex() {
	for _, h := range v.sorted {
		v.index.Update(h)
	}
}

// FullScan returns v without its index: Place over it looks at every host.
func (v *View) FullScan() scheduler.View { return fullScan{v} }

// fullScan hides the Index method of the view it embeds.
type fullScan struct{ scheduler.View }

// Hosts implements scheduler.View, in id order.
func (v *View) Hosts() []*scheduler.Host { return v.sorted }

// Host implements scheduler.View.
func (v *View) Host(id string) (*scheduler.Host, bool) { h, ok := v.hosts[id]; return h, ok }

// Placement implements scheduler.View.
func (v *View) Placement(key string) (scheduler.Placement, bool) {
	p, ok := v.placements[key]
	return p, ok
}

// Usage implements scheduler.View.
func (v *View) Usage(tenant string) scheduler.Usage { return v.usage[tenant] }

// TenantAllocated implements scheduler.View.
func (v *View) TenantAllocated(hostID, tenant string) scheduler.Resources {
	var r scheduler.Resources
	for _, p := range v.placements {
		if p.HostID == hostID && p.Tenant == tenant {
			r = r.Add(p.Resources)
		}
	}
	return r
}

// TenantSandboxes implements scheduler.View.
func (v *View) TenantSandboxes(hostID, tenant string) int {
	n := 0
	for _, p := range v.placements {
		if p.HostID == hostID && p.Tenant == tenant {
			n++
		}
	}
	return n
}

// Quota implements scheduler.View.
func (v *View) Quota(string) scheduler.Quota { return v.TenantQuota }

// Commit applies an admitted plan: the placement, the host's allocation and
// the tenant's usage. It does not check the plan; see Harness.Commit.
func (v *View) Commit(p scheduler.Plan) {
	if _, ok := v.placements[p.SessionID]; ok {
		return
	}
	v.placements[p.SessionID] = scheduler.Placement{SessionID: p.SessionID, Tenant: p.Tenant, HostID: p.HostID, Resources: p.Resources, Limits: p.Limits}
	v.index.Count(p.HostID, p.Tenant, 1)
	h := v.hosts[p.HostID]
	h.Allocated = h.Allocated.Add(p.Resources)
	u := v.usage[p.Tenant]
	u.Sandboxes++
	u.CPUMillis += p.Resources.CPUMillis
	u.MemoryMiB += p.Resources.MemoryMiB
	v.usage[p.Tenant] = u
}

// Host returns a ready, eligible host with capacity cpu millis and mem MiB
// and 100 GiB of disk, advertising the runsc runtime.
func Host(id string, cpu, mem int64) scheduler.Host {
	return scheduler.Host{
		ID: id, Status: scheduler.StatusReady, Eligible: true,
		Runtimes: []string{"runsc"},
		Capacity: scheduler.Resources{CPUMillis: cpu, MemoryMiB: mem, DiskMiB: 100 << 10},
	}
}

// Fleet returns n identical hosts named host-0000 ... .
func Fleet(n int, cpu, mem int64) []scheduler.Host {
	out := make([]scheduler.Host, n)
	for i := range out {
		out[i] = Host(fmt.Sprintf("host-%04d", i), cpu, mem)
	}
	return out
}

// Harness places requests against a View and records every plan.
type Harness struct {
	t      testing.TB
	View   *View
	Config scheduler.Config
	Quota  scheduler.Quota
	Plans  []scheduler.Plan // every plan Place returned, in order
}

// New returns a harness over hosts with the default config and no quota.
func New(t testing.TB, hosts ...scheduler.Host) *Harness {
	return &Harness{t: t, View: NewView(hosts...)}
}

// Place plans r and records the plan.
func (h *Harness) Place(r scheduler.Request) (scheduler.Plan, error) {
	h.View.TenantQuota = h.Quota
	h.View.Reindex()
	p, err := scheduler.Place(h.View, r, h.Config)
	if err == nil {
		h.Plans = append(h.Plans, p)
	}
	return p, err
}

// Commit admits p against the current view and quota and, if admitted,
// applies it.
func (h *Harness) Commit(p scheduler.Plan) error {
	h.View.TenantQuota = h.Quota
	if err := scheduler.Admit(h.View, p, h.Quota); err != nil {
		return err
	}
	h.View.Commit(p)
	return nil
}

// MustPlace places and commits r, failing the test on error.
func (h *Harness) MustPlace(r scheduler.Request) scheduler.Plan {
	h.t.Helper()
	p, err := h.Place(r)
	if err != nil {
		h.t.Fatalf("place %s: %v", r.SessionID, err)
	}
	if err := h.Commit(p); err != nil {
		h.t.Fatalf("commit %s: %v", r.SessionID, err)
	}
	return p
}
