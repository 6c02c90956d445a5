package scheduler

// PlaceMove plans the move of a placed session, r.SessionID, to another
// host: as Place would in a view where the session is not placed, among
// the hosts only accepts (nil: every host). Zone spread counts the
// tenant's sandboxes of the whole fleet, the moving one left out, whatever
// only accepts. Like Place it plans over the view's index when it has one
// (a drain or a host loss moves many sessions: each move costs its
// candidates, not the fleet), and only a move that fits nowhere scans
// every host to build its *NoFitError; TestIndexedMovesMatchFullScan
// holds the two paths to the same plans.
func PlaceMove(v View, r Request, cfg Config, only func(*Host) bool) (Plan, error) {
	if err := r.Validate(); err != nil {
		return Plan{}, err
	}
	cfg = cfg.withDefaults()
	cur, placed := v.Placement(r.SessionID)
	mv := moveView{View: v, cur: cur, placed: placed}
	if ix, ok := v.(Indexed); ok {
		index := ix.Index()
		zones := func(z string) int { return index.ZoneSandboxes(z, r.Tenant) - mv.selfIn(z, r.Tenant) }
		lists := index.Candidates(r.Pools, r.provider())
		if only != nil {
			lists = accepted(lists, only)
		}
		if p, ok := choose(mv, &r, cfg, lists, zones, nil); ok {
			return p, nil
		}
	}
	all := v.Hosts()
	var zones func(string) int // only zone spread counts them
	if r.SpreadZones {
		zones = fleetZones(mv, all, r.Tenant)
	}
	hosts := all
	if only != nil {
		hosts = accepted([][]*Host{all}, only)[0]
	}
	nofit := NoFitError{SessionID: r.SessionID, Considered: len(hosts), Rejected: map[Filter]int{}, Pools: r.Pools}
	if p, ok := choose(mv, &r, cfg, [][]*Host{hosts}, zones, nofit.Rejected); ok {
		return p, nil
	}
	return Plan{}, &nofit
}

// accepted is lists with only the hosts only accepts, as one list (lists
// share no host, so nothing is counted twice).
func accepted(lists [][]*Host, only func(*Host) bool) [][]*Host {
	var out []*Host
	for _, l := range lists {
		for _, h := range l {
			if only(h) {
				out = append(out, h)
			}
		}
	}
	return [][]*Host{out}
}

// moveView is a view in which the moving session, cur, is not placed.
type moveView struct {
	View
	cur    Placement
	placed bool
}

func (m moveView) Placement(key string) (Placement, bool) {
	if m.placed && key == m.cur.SessionID {
		return Placement{}, false
	}
	return m.View.Placement(key)
}

// TenantSandboxes does not count the moving session.
func (m moveView) TenantSandboxes(hostID, tenant string) int {
	n := m.View.TenantSandboxes(hostID, tenant)
	if m.placed && m.cur.HostID == hostID && m.cur.Tenant == tenant {
		n--
	}
	return n
}

// selfIn is 1 when the moving session is tenant's and its host is in
// zone, else 0.
func (m moveView) selfIn(zone, tenant string) int {
	if !m.placed || m.cur.Tenant != tenant {
		return 0
	}
	if h, ok := m.View.Host(m.cur.HostID); ok && h.Labels[ZoneLabel] == zone {
		return 1
	}
	return 0
}
