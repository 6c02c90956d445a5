package scheduler

import (
	"slices"
	"strings"
)

// Index files a fleet's hosts by what a request narrows them by first:
// the schedulable hosts (ready, eligible, not draining, every condition
// OK) by pool and by provider, and each tenant's placements by zone
// (of every host, schedulable or not). Place, given a
// view that keeps one (Indexed), looks only at the hosts of the
// request's pools that offer its provider, so a placement costs
// O(candidates), not O(fleet).
//
// The index only narrows: Place still runs every filter on each
// candidate, scores them alike and breaks ties by the lowest host id, so
// its plan is the full scan's (TestIndexedPlansMatchFullScan). A host
// the index leaves out would fail one of the filters it files by. When
// no candidate fits, Place scans the whole fleet for its NoFitError, so
// the error counts every host as before.
//
// Its owner calls Update after every change to a host it holds (labels,
// status, eligibility, draining, conditions, runtimes, providers); an
// Index is not safe for concurrent writes, and must not change while
// Place reads it (the owner's lock covers both, as the view's does).
type Index struct {
	// filed is, per host id, the keys it is filed under and its zone.
	filed map[string]filing
	// lists holds the hosts under each key, in id order.
	lists map[indexKey][]*Host
	// onHost counts each tenant's placements on each host (by host id,
	// filed or not), as the owner reports them (Count); inZone sums
	// them over the filed hosts of each zone, for zone spread.
	onHost map[string]map[string]int
	inZone map[string]map[string]int
}

// indexKey is one list of the index: the hosts of a pool (or of any
// pool) offering a provider ("" for any).
type indexKey struct {
	pool     string
	anyPool  bool
	provider string
}

type filing struct {
	keys []indexKey
	zone string
}

// Indexed is a View that keeps an Index of its hosts. Place uses it when
// the view implements it.
type Indexed interface {
	View
	// Index returns the view's index, current with its hosts (Update)
	// and its placements (Count, agreeing with TenantSandboxes).
	Index() *Index
}

// NewIndex returns an index of hosts.
func NewIndex(hosts ...*Host) *Index {
	ix := &Index{filed: map[string]filing{}, lists: map[indexKey][]*Host{},
		onHost: map[string]map[string]int{}, inZone: map[string]map[string]int{}}
	for _, h := range hosts {
		ix.Update(h)
	}
	return ix
}

// Schedulable reports whether h may take new placements at all, whatever
// the request: ready, eligible, not draining and healthy (the filters
// before the pool's).
func (h *Host) Schedulable() bool {
	return h.Status == StatusReady && h.Eligible && !h.Draining && h.Healthy()
}

// Update files h as it is now, taking it out of where it was filed
// before. The index holds the pointer: the owner passes the *Host its
// view returns, and calls Update again whenever it changes.
func (ix *Index) Update(h *Host) {
	ix.Remove(h.ID)
	f := filing{zone: h.Labels[ZoneLabel]}
	if h.Schedulable() {
		pool := h.Labels[PoolLabel]
		provs := []string{""}
		for _, p := range slices.Concat(h.Providers, h.Runtimes) {
			if p != "" && !slices.Contains(provs, p) {
				provs = append(provs, p)
			}
		}
		for _, p := range provs {
			f.keys = append(f.keys, indexKey{pool: pool, provider: p}, indexKey{anyPool: true, provider: p})
		}
		for _, k := range f.keys {
			ix.lists[k] = insertHost(ix.lists[k], h)
		}
	}
	ix.filed[h.ID] = f
	for tenant, n := range ix.onHost[h.ID] {
		ix.addInZone(f.zone, tenant, n)
	}
}

// Count adds n (negative: takes away) to the placements tenant has on
// the host with id, which need not be filed yet: the owner calls it as
// placements come and go, so that zone spread reads a zone's count
// without a pass over its hosts.
func (ix *Index) Count(hostID, tenant string, n int) {
	t := ix.onHost[hostID]
	if t == nil {
		t = map[string]int{}
		ix.onHost[hostID] = t
	}
	if t[tenant] += n; t[tenant] == 0 {
		delete(t, tenant)
		if len(t) == 0 {
			delete(ix.onHost, hostID)
		}
	}
	if f, ok := ix.filed[hostID]; ok {
		ix.addInZone(f.zone, tenant, n)
	}
}

// ZoneSandboxes returns how many placements tenant has on the filed hosts
// of a zone ("" for the hosts without one).
func (ix *Index) ZoneSandboxes(zone, tenant string) int { return ix.inZone[zone][tenant] }

func (ix *Index) addInZone(zone, tenant string, n int) {
	z := ix.inZone[zone]
	if z == nil {
		z = map[string]int{}
		ix.inZone[zone] = z
	}
	if z[tenant] += n; z[tenant] == 0 {
		delete(z, tenant)
		if len(z) == 0 {
			delete(ix.inZone, zone)
		}
	}
}

// Remove takes the host with id out of the index (its placements' counts
// stay, for when it is filed again).
func (ix *Index) Remove(id string) {
	f, ok := ix.filed[id]
	if !ok {
		return
	}
	delete(ix.filed, id)
	for tenant, n := range ix.onHost[id] {
		ix.addInZone(f.zone, tenant, -n)
	}
	for _, k := range f.keys {
		if l := removeHost(ix.lists[k], id); len(l) > 0 {
			ix.lists[k] = l
		} else {
			delete(ix.lists, k)
		}
	}
}

// Candidates returns the schedulable hosts of pools (none: any pool)
// that offer provider ("": any), as lists that share no host.
func (ix *Index) Candidates(pools []string, provider string) [][]*Host {
	if len(pools) == 0 {
		if l := ix.lists[indexKey{anyPool: true, provider: provider}]; len(l) > 0 {
			return [][]*Host{l}
		}
		return nil
	}
	out := make([][]*Host, 0, len(pools))
	for i, p := range pools {
		if slices.Contains(pools[:i], p) {
			continue // a pool named twice
		}
		if l := ix.lists[indexKey{pool: p, provider: provider}]; len(l) > 0 {
			out = append(out, l)
		}
	}
	return out
}

func insertHost(l []*Host, h *Host) []*Host {
	i, found := slices.BinarySearchFunc(l, h.ID, func(e *Host, id string) int { return strings.Compare(e.ID, id) })
	if found {
		l[i] = h
		return l
	}
	return slices.Insert(l, i, h)
}

func removeHost(l []*Host, id string) []*Host {
	i, found := slices.BinarySearchFunc(l, id, func(e *Host, id string) int { return strings.Compare(e.ID, id) })
	if !found {
		return l
	}
	return slices.Delete(l, i, i+1)
}
