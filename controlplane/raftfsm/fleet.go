package raftfsm

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
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

// HostCA is the hosts' certificate authority, PEM. Its key is replicated
// state: every node must be able to sign a joining host's certificate.
type HostCA struct {
	CertPEM []byte `json:"cert_pem"`
	KeyPEM  []byte `json:"key_pem"`
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
type MovePayload struct {
	SessionKey string         `json:"session_key"`
	From       string         `json:"from"`
	Plan       scheduler.Plan `json:"plan"`
}

// HostEndpointPayload records the address where a control-plane node serves
// HostService ("" forgets it): a follower names the leader's to hosts.
type HostEndpointPayload struct {
	NodeID string `json:"node_id"`
	Addr   string `json:"addr"`
}

func applySetHostCA(f *FSM, _ uint64, payload json.RawMessage) (any, error) {
	ca, err := decode[HostCA](payload)
	if err != nil {
		return nil, err
	}
	if f.s.HostCA != nil {
		return *f.s.HostCA, nil
	}
	if len(ca.CertPEM) == 0 || len(ca.KeyPEM) == 0 {
		return nil, errdefs.InvalidArgument("host CA needs a certificate and a key")
	}
	f.s.HostCA = &ca
	return ca, nil
}

func applyAddJoinToken(f *FSM, _ uint64, payload json.RawMessage) (any, error) {
	p, err := decode[AddJoinTokenPayload](payload)
	if err != nil {
		return nil, err
	}
	if len(p.Hash) != 64 || !p.Expires.After(p.Now) {
		return nil, errdefs.InvalidArgument("join token needs a SHA-256 and an expiry in the future")
	}
	for h, t := range f.s.JoinTokens {
		if !p.Now.Before(t.Expires) {
			delete(f.s.JoinTokens, h)
		}
	}
	if _, ok := f.s.JoinTokens[p.Hash]; ok {
		return nil, errdefs.AlreadyExists("join token already recorded")
	}
	f.s.JoinTokens[p.Hash] = JoinTokenState{Expires: p.Expires}
	return struct{}{}, nil
}

func applyConsumeJoinToken(f *FSM, _ uint64, payload json.RawMessage) (any, error) {
	p, err := decode[ConsumeJoinTokenPayload](payload)
	if err != nil {
		return nil, err
	}
	t, ok := f.s.JoinTokens[p.Hash]
	switch {
	case p.HostID == "":
		return nil, errdefs.InvalidArgument("joining needs a host id")
	case !ok:
		return nil, errdefs.Unauthenticated("join token unknown")
	case t.UsedBy != "":
		return nil, errdefs.Unauthenticated("join token already used")
	case !p.Now.Before(t.Expires):
		return nil, errdefs.Unauthenticated("join token expired")
	case f.s.JoinedHosts[p.HostID]:
		// A token is not bound to a host id, so the id must be new: otherwise
		// a token holder could take over a joined host's identity.
		return nil, errdefs.AlreadyExists("host %q has already joined; a host keeps its certificate in its state dir", p.HostID)
	}
	t.UsedBy = p.HostID
	f.s.JoinTokens[p.Hash] = t
	f.s.JoinedHosts[p.HostID] = true
	return struct{}{}, nil
}

func applyMovePlacement(f *FSM, index uint64, payload json.RawMessage) (any, error) {
	p, err := decode[MovePayload](payload)
	if err != nil {
		return nil, err
	}
	cur, ok := f.s.Placements[p.SessionKey]
	switch {
	case !ok:
		return nil, errdefs.NotFound("placement for session %s", p.SessionKey)
	case cur.HostID != p.From && cur.HostID == p.Plan.HostID:
		return cur, nil // already moved there: idempotent
	case cur.HostID != p.From:
		return nil, errdefs.Conflict("session %s is on host %s, not %s", p.SessionKey, cur.HostID, p.From)
	case p.Plan.HostID == p.From:
		return nil, errdefs.Conflict("move of session %s: the plan keeps it on host %s", p.SessionKey, p.From)
	case p.Plan.SessionKey != p.SessionKey || p.Plan.Tenant != cur.Tenant:
		return nil, errdefs.InvalidArgument("move of session %s: the plan is for %s/%s", p.SessionKey, p.Plan.Tenant, p.Plan.SessionKey)
	}
	f.unplace(cur)
	if err := scheduler.Admit(fsmView{f}, p.Plan, f.quota(cur.Tenant)); err != nil {
		f.place(cur)
		return nil, err
	}
	pl := cur
	pl.HostID, pl.Resources, pl.SandboxID = p.Plan.HostID, p.Plan.Resources, fmt.Sprintf("sbx-%d", index)
	f.place(pl)
	return pl, nil
}

// place records a placement. Call with mu held for writing.
func (f *FSM) place(pl scheduler.Placement) {
	f.s.Placements[pl.SessionKey] = pl
	if h, ok := f.s.Hosts[pl.HostID]; ok {
		h.Allocated = h.Allocated.Add(pl.Resources)
	}
	f.account(pl, 1)
	f.changed(pl.HostID)
}

// unplace drops a placement. Call with mu held for writing.
func (f *FSM) unplace(pl scheduler.Placement) {
	delete(f.s.Placements, pl.SessionKey)
	if h, ok := f.s.Hosts[pl.HostID]; ok {
		h.Allocated = h.Allocated.Sub(pl.Resources)
	}
	f.account(pl, -1)
	f.changed(pl.HostID)
}

// changed tells the watcher that a host's placements changed ("": every
// host's, after a restore).
func (f *FSM) changed(hostID string) {
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

func applySetHostEndpoint(f *FSM, _ uint64, payload json.RawMessage) (any, error) {
	p, err := decode[HostEndpointPayload](payload)
	if err != nil {
		return nil, err
	}
	if p.NodeID == "" {
		return nil, errdefs.InvalidArgument("host endpoint needs a node id")
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
	sort.Slice(out, func(i, j int) bool { return out[i].SessionKey < out[j].SessionKey })
	return out
}

// PlacementCount returns how many placements a host holds.
func (v View) PlacementCount(hostID string) int { return len(v.f.byHost[hostID]) }

// HasPlacementOn reports whether a session is placed on a host.
func (v View) HasPlacementOn(hostID, sessionKey string) bool {
	_, ok := v.f.byHost[hostID][sessionKey]
	return ok
}
