package raftfsm

import (
	"fmt"
	"maps"
	"sort"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/seal"
)

// The host protocol's commands: the CA every node signs host certificates
// with, one-time join tokens, moving a placement to another host, and where
// each node serves HostService.
const (
	CmdSetHostCA        CommandType = "set_host_ca"        // HostCA: the first one set wins
	CmdAddJoinToken     CommandType = "add_join_token"     // AddJoinTokenPayload
	CmdConsumeJoinToken CommandType = "consume_join_token" // ConsumeJoinTokenPayload
	CmdMovePlacement    CommandType = "move_placement"     // MovePayload
	CmdSetHostEndpoint  CommandType = "set_host_endpoint"  // HostEndpointPayload
)

// HostCA is the hosts' certificate authority: its certificate, PEM, and its
// key sealed (SealHostCAKey; see internal/seal). The key is replicated
// state, every node must be able to sign a joining host's certificate, so
// the Raft log and snapshots hold it encrypted only.
type HostCA struct {
	CertPEM []byte      `json:"cert_pem"`
	Key     seal.Sealed `json:"key"`
}

// JoinTokenState is a join token as the FSM keeps it: never the secret.
type JoinTokenState struct {
	Expires time.Time `json:"expires"`
	UsedBy  string    `json:"used_by,omitempty"` // host id that consumed it
}

// AddJoinTokenPayload records a new token by the hex SHA-256 of its secret.
// Now is the proposer's clock: expired tokens are forgotten against it, so
// every replica forgets the same ones.
type AddJoinTokenPayload struct {
	Hash    string    `json:"hash"`
	Expires time.Time `json:"expires"`
	Now     time.Time `json:"now"`
}

// ConsumeJoinTokenPayload uses a token for a host. A token works once,
// before it expires (checked against Now, the proposer's clock), and only
// for a host id that has not joined before.
type ConsumeJoinTokenPayload struct {
	Hash   string    `json:"hash"`
	HostID string    `json:"host_id"`
	Now    time.Time `json:"now"`
}

// MovePayload moves a session's placement from one host to the plan's host
// in one step: the placement must still be on From, and the plan must pass
// scheduler.Admit with the old placement taken away.
//
// The moved placement is not ready (its new host has not reported it) and
// carries Fence: a drain keeps its fence until the workspace is restored
// on the new host; a move off a lost host carries none.
type MovePayload struct {
	SessionID string           `json:"session_key"`
	From      string           `json:"from"`
	Plan      scheduler.Plan   `json:"plan"`
	Fence     *scheduler.Fence `json:"fence,omitempty"`
}

// HostEndpointPayload records the address where a control-plane node serves
// HostService ("" forgets it): a follower names the leader's to hosts.
type HostEndpointPayload struct {
	NodeID string `json:"node_id"`
	Addr   string `json:"addr"`
}

func applySetHostCA(f *FSM, _ uint64, ca HostCA) (HostCA, error) {
	if f.s.HostCA != nil {
		return *f.s.HostCA, nil
	}
	if len(ca.CertPEM) == 0 || ca.Key.IsZero() {
		return HostCA{}, errdefs.InvalidArgument("host CA needs a certificate and a sealed key")
	}
	f.s.HostCA = &ca
	return ca, nil
}

func applyAddJoinToken(f *FSM, _ uint64, p AddJoinTokenPayload) (struct{}, error) {
	return struct{}{}, addToken(f.s.JoinTokens, p)
}

// addToken records a token in tokens (hosts' or nodes'), forgetting the
// expired ones.
func addToken(tokens map[string]JoinTokenState, p AddJoinTokenPayload) error {
	if len(p.Hash) != 64 || !p.Expires.After(p.Now) {
		return errdefs.InvalidArgument("join token needs a SHA-256 and an expiry in the future")
	}
	for h, t := range tokens {
		if !p.Now.Before(t.Expires) {
			delete(tokens, h)
		}
	}
	if _, ok := tokens[p.Hash]; ok {
		return errdefs.AlreadyExists("join token already recorded")
	}
	tokens[p.Hash] = JoinTokenState{Expires: p.Expires}
	return nil
}

func applyConsumeJoinToken(f *FSM, _ uint64, p ConsumeJoinTokenPayload) (struct{}, error) {
	t, ok := f.s.JoinTokens[p.Hash]
	switch {
	case p.HostID == "":
		return struct{}{}, errdefs.InvalidArgument("joining needs a host id")
	case !ok:
		return struct{}{}, errdefs.Unauthenticated("join token unknown")
	case t.UsedBy != "":
		return struct{}{}, errdefs.Unauthenticated("join token already used")
	case !p.Now.Before(t.Expires):
		return struct{}{}, errdefs.Unauthenticated("join token expired")
	case f.s.JoinedHosts[p.HostID]:
		// A token is not bound to a host id, so the id must be new: otherwise
		// a token holder could take over a joined host's identity.
		return struct{}{}, errdefs.AlreadyExists("host %q has already joined; a host keeps its certificate in its state dir", p.HostID)
	}
	t.UsedBy = p.HostID
	f.s.JoinTokens[p.Hash] = t
	f.s.JoinedHosts[p.HostID] = true
	return struct{}{}, nil
}

func applyMovePlacement(f *FSM, index uint64, p MovePayload) (scheduler.Placement, error) {
	cur, ok := f.s.Placements[p.SessionID]
	switch {
	case !ok:
		return scheduler.Placement{}, errdefs.NotFound("placement for session %s", p.SessionID)
	case cur.HostID != p.From && cur.HostID == p.Plan.HostID:
		return cur, nil // already moved there: idempotent
	case cur.HostID != p.From:
		return scheduler.Placement{}, errdefs.Conflict("session %s is on host %s, not %s", p.SessionID, cur.HostID, p.From)
	case p.Plan.HostID == p.From:
		return scheduler.Placement{}, errdefs.Conflict("move of session %s: the plan keeps it on host %s", p.SessionID, p.From)
	case p.Plan.SessionID != p.SessionID || p.Plan.Tenant != cur.Tenant:
		return scheduler.Placement{}, errdefs.InvalidArgument("move of session %s: the plan is for %s/%s", p.SessionID, p.Plan.Tenant, p.Plan.SessionID)
	}
	f.unplace(cur)
	if err := scheduler.Admit(fsmView{f}, p.Plan, f.quota(cur.Tenant)); err != nil {
		f.place(cur)
		return scheduler.Placement{}, err
	}
	pl := cur
	pl.HostID, pl.Resources, pl.SandboxID = p.Plan.HostID, p.Plan.Resources, fmt.Sprintf("sbx-%d", index)
	if p.Plan.Limits != (scheduler.Resources{}) {
		pl.Limits = p.Plan.Limits
	}
	pl.Ready, pl.Fence = false, p.Fence
	pl.State, pl.PausedDiskMiB = "", 0 // the new host runs a new sandbox
	pl.Moved = ""                      // the mover says how, as it lifts its fence
	f.place(pl)
	return pl, nil
}

func applySetReady(f *FSM, _ uint64, p ReadyPayload) (scheduler.Placement, error) {
	cur, ok := f.s.Placements[p.SessionID]
	switch {
	case !ok:
		return cur, errdefs.NotFound("placement for session %s", p.SessionID)
	case cur.HostID != p.HostID || cur.SandboxID != p.SandboxID:
		return cur, nil // about a sandbox since moved or replaced
	}
	cur.Ready = p.Ready
	f.s.Placements[p.SessionID] = cur
	return cur, nil
}

func applySetFence(f *FSM, _ uint64, p FencePayload) (scheduler.Placement, error) {
	cur, ok := f.s.Placements[p.SessionID]
	switch {
	case !ok:
		return cur, errdefs.NotFound("placement for session %s", p.SessionID)
	case p.Owner == "" || !p.Until.After(p.Now):
		return cur, errdefs.InvalidArgument("a fence needs an owner and an end after now")
	case cur.Fence.Holds(p.Now) && cur.Fence.Owner != p.Owner:
		return cur, errdefs.Conflict("the sandbox of session %s is held by another mover (%s) until %s", p.SessionID, cur.Fence.Owner, cur.Fence.Until.Format(time.RFC3339))
	}
	cur.Fence = &scheduler.Fence{Owner: p.Owner, Until: p.Until}
	f.s.Placements[p.SessionID] = cur
	return cur, nil
}

func applyLiftFence(f *FSM, _ uint64, p FencePayload) (scheduler.Placement, error) {
	cur, ok := f.s.Placements[p.SessionID]
	if !ok {
		return cur, errdefs.NotFound("placement for session %s", p.SessionID)
	}
	if cur.Fence != nil && cur.Fence.Owner == p.Owner {
		cur.Fence = nil
		if p.Moved != "" {
			cur.Moved = p.Moved
		}
		f.s.Placements[p.SessionID] = cur
	}
	return cur, nil
}

// place records a placement. Call with mu held for writing.
func (f *FSM) place(pl scheduler.Placement) {
	f.s.Placements[pl.SessionID] = pl
	if h, ok := f.s.Hosts[pl.HostID]; ok {
		h.Allocated = h.Allocated.Add(pl.Reserved())
	}
	f.account(pl, 1)
	f.placementsChanged(pl.HostID)
}

// unplace drops a placement. Call with mu held for writing.
func (f *FSM) unplace(pl scheduler.Placement) {
	delete(f.s.Placements, pl.SessionID)
	if h, ok := f.s.Hosts[pl.HostID]; ok {
		h.Allocated = h.Allocated.Sub(pl.Reserved())
	}
	f.account(pl, -1)
	f.placementsChanged(pl.HostID)
}

// placementsChanged tells the watcher that a host's placements changed ("": every
// host's, after a restore).
func (f *FSM) placementsChanged(hostID string) {
	if w := f.watch.Load(); w != nil {
		(*w)(hostID)
	}
}

// WatchPlacements makes fn be called whenever the placements on a host
// change on this replica, with the host's id, or with "" when every host's
// may have (a snapshot was restored). fn runs inside the FSM's apply, under
// its lock: it must be quick and must not read the FSM. One watcher; nil
// removes it.
func (n *Node) WatchPlacements(fn func(hostID string)) {
	if fn == nil {
		n.fsm.watch.Store(nil)
		return
	}
	n.fsm.watch.Store(&fn)
}

func applySetHostEndpoint(f *FSM, _ uint64, p HostEndpointPayload) (HostEndpointPayload, error) {
	if p.NodeID == "" {
		return p, errdefs.InvalidArgument("host endpoint needs a node id")
	}
	if p.Addr == "" {
		delete(f.s.HostEndpoints, p.NodeID)
	} else {
		f.s.HostEndpoints[p.NodeID] = p.Addr
	}
	return p, nil
}

// HostCA returns the hosts' CA, or nil before one is set.
func (v View) HostCA() *HostCA { return v.f.s.HostCA }

// HostEndpoint returns where a node serves HostService, or "".
func (v View) HostEndpoint(nodeID string) string { return v.f.s.HostEndpoints[nodeID] }

// JoinToken returns a token's state by the hex SHA-256 of its secret.
func (v View) JoinToken(hash string) (JoinTokenState, bool) {
	t, ok := v.f.s.JoinTokens[hash]
	return t, ok
}

// HostPlacements returns the placements on a host, in session key order.
func (v View) HostPlacements(hostID string) []scheduler.Placement {
	keys := v.f.byHost[hostID]
	out := make([]scheduler.Placement, 0, len(keys))
	for k := range keys {
		out = append(out, v.f.s.Placements[k])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SessionID < out[j].SessionID })
	return out
}

// PlacementCount returns how many placements a host holds.
func (v View) PlacementCount(hostID string) int { return len(v.f.byHost[hostID]) }

// HasPlacementOn reports whether a session is placed on a host.
func (v View) HasPlacementOn(hostID, sessionID string) bool {
	_, ok := v.f.byHost[hostID][sessionID]
	return ok
}

func applySetWarm(f *FSM, _ uint64, p WarmPayload) (scheduler.Host, error) {
	h, ok := f.s.Hosts[p.HostID]
	if !ok {
		return scheduler.Host{}, errdefs.NotFound("host %s", p.HostID)
	}
	for k, n := range p.Warm {
		if n < 0 {
			return scheduler.Host{}, errdefs.InvalidArgument("host %s: warm count %d for %s", p.HostID, n, k)
		}
	}
	h.Warm = nil
	if len(p.Warm) > 0 {
		h.Warm = maps.Clone(p.Warm)
	}
	return *h, nil
}

// takeWarm counts one warm sandbox of the placement's class as taken on
// its host, until the host's next heartbeat says what its pool holds: two
// placements in a row do not both count on the host's last warm sandbox.
// Call with mu held for writing.
func (f *FSM) takeWarm(pl scheduler.Placement) {
	h, ok := f.s.Hosts[pl.HostID]
	if !ok || pl.Image == "" {
		return
	}
	k := scheduler.WarmKey(pl.Image, pl.Runtime)
	if h.Warm[k] > 0 {
		h.Warm = maps.Clone(h.Warm) // a Read may hold the old map
		h.Warm[k]--
	}
}
