package hosts

import (
	"sync"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// A host's egress records name a tenant and a session, but a host can lie
// (a compromised one would write audit rows into any tenant): the control
// plane keeps a record only when the session is placed on the host that
// sent it, by the FSM, or was within EgressGrace, and stores it under the
// placement's tenant. A record whose tenant is not the placement's, or
// whose session the host does not hold, is rejected: counted
// (Config.ObserveEgressRejected) and logged at most once per host per
// minute.
//
// The grace: a record can trail its sandbox's release (the proxy's last
// connection was cut as the sandbox was destroyed and its heartbeat came
// after the release; a heartbeat whose ack was lost is sent again). So the
// leader remembers, per host, each placement it saw there until
// EgressGrace after it saw it gone. The memory is the leader's: a record
// that trails a release across a change of leader, by more than the new
// leader saw, is rejected and counted.

// DefaultEgressGrace is how long a released placement still vouches for
// its host's egress records.
const DefaultEgressGrace = 5 * time.Minute

// egressLogEvery bounds the rejection log lines: one per host per this.
const egressLogEvery = time.Minute

// Reasons a record is rejected (ObserveEgressRejected's label values).
const (
	EgressNotPlaced      = "not_placed"      // the session is not (nor was recently) placed on the host
	EgressTenantMismatch = "tenant_mismatch" // the record's tenant is not the placement's
)

// placements is the leader's memory of which sessions were placed on
// which host, for egress records (see above).
type placements struct {
	// mu guards the fields below.
	mu sync.Mutex
	// byHost: host id -> session id -> what was placed.
	byHost map[string]map[string]seenPlacement
	// logged is when a host's rejections were last logged, and
	// unlogged how many were rejected since.
	logged   map[string]time.Time
	unlogged map[string]int
}

type seenPlacement struct {
	tenant string
	gone   time.Time // zero while placed
}

func newPlacements() *placements {
	return &placements{byHost: map[string]map[string]seenPlacement{}, logged: map[string]time.Time{}, unlogged: map[string]int{}}
}

// note records the host's placements now (session id -> tenant): those no
// longer among them are gone from now, and forgotten grace after.
func (p *placements) note(hostID string, now map[string]string, at time.Time, grace time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.byHost[hostID]
	if m == nil {
		m = map[string]seenPlacement{}
		p.byHost[hostID] = m
	}
	for id, sp := range m {
		if _, ok := now[id]; ok {
			continue
		}
		switch {
		case sp.gone.IsZero():
			sp.gone = at
			m[id] = sp
		case at.Sub(sp.gone) > grace:
			delete(m, id)
		}
	}
	for id, t := range now {
		m[id] = seenPlacement{tenant: t}
	}
}

// tenant is the tenant of session's placement on the host, if it is
// placed there or was within grace.
func (p *placements) tenant(hostID, sessionID string, at time.Time, grace time.Duration) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp, ok := p.byHost[hostID][sessionID]
	if !ok || !sp.gone.IsZero() && at.Sub(sp.gone) > grace {
		return "", false
	}
	return sp.tenant, true
}

// rejected counts n rejections of the host's records and reports whether
// to log them now, and how many since the last line.
func (p *placements) rejected(hostID string, n int, at time.Time) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unlogged[hostID] += n
	if last, ok := p.logged[hostID]; ok && at.Sub(last) < egressLogEvery {
		return 0, false
	}
	total := p.unlogged[hostID]
	p.logged[hostID] = at
	p.unlogged[hostID] = 0
	return total, true
}

// hostPlacements reads the host's placements from the FSM: session id ->
// tenant.
func (s *Service) hostPlacements(hostID string) map[string]string {
	out := map[string]string{}
	s.node.Read(func(v raftfsm.View) {
		for _, p := range v.HostPlacements(hostID) {
			out[p.SessionID] = p.Tenant
		}
	})
	return out
}

// vouch keeps the records of sessions placed on the host (now, or within
// the grace), with the placement's tenant, and rejects the rest.
func (s *Service) vouch(hostID string, recs []*pb.EgressRecord) []*pb.EgressRecord {
	now := s.cfg.Now()
	s.placed.note(hostID, s.hostPlacements(hostID), now, s.cfg.EgressGrace)
	kept := recs[:0]
	var notPlaced, mismatch int
	for _, r := range recs {
		t, ok := s.placed.tenant(hostID, r.GetSessionId(), now, s.cfg.EgressGrace)
		switch {
		case !ok:
			notPlaced++
		case r.GetTenant() != t:
			mismatch++
		default:
			r.Tenant = t
			kept = append(kept, r)
		}
	}
	if notPlaced > 0 {
		s.cfg.ObserveEgressRejected(EgressNotPlaced, notPlaced)
	}
	if mismatch > 0 {
		s.cfg.ObserveEgressRejected(EgressTenantMismatch, mismatch)
	}
	if n := notPlaced + mismatch; n > 0 {
		if total, ok := s.placed.rejected(hostID, n, now); ok {
			s.log.Warn("egress audit records rejected: their sessions are not placed on the host that sent them, or not under the tenant they name",
				"host_id", hostID, "rejected", total, "not_placed", notPlaced, "tenant_mismatch", mismatch)
		}
	}
	return kept
}
