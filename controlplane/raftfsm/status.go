package raftfsm

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
)

// Status is a node's view of its cluster.
type Status struct {
	ID           string
	State        string // raft's: Follower, Candidate, Leader, Shutdown
	Leader       string // the leader's id, "" when unknown
	AppliedIndex uint64
	Members      []MemberStatus
}

// MemberStatus is one server in the cluster configuration.
type MemberStatus struct {
	ID       string
	RaftAddr string
	HTTPAddr string // "" until the member has announced it
	Voter    bool
	Leader   bool
}

// Status describes this node and the members it knows. Its member list is
// this node's copy of the configuration: on a partitioned node it may lag.
func (n *Node) Status() (Status, error) {
	servers, err := n.Members()
	if err != nil {
		return Status{}, err
	}
	st := Status{ID: n.cfg.ID, State: n.raft.State().String(), Leader: n.Leader(), AppliedIndex: n.AppliedIndex()}
	n.fsm.Read(func(v View) {
		for _, s := range servers {
			st.Members = append(st.Members, MemberStatus{
				ID: string(s.ID), RaftAddr: string(s.Address), HTTPAddr: v.Member(string(s.ID)),
				Voter: s.Suffrage == raft.Voter, Leader: string(s.ID) == st.Leader,
			})
		}
	})
	return st, nil
}

// Initialized reports whether dataDir holds a node's Raft state, so that a
// start needs neither bootstrap nor join.
func Initialized(dataDir string) bool {
	_, err := os.Stat(filepath.Join(dataDir, "raft.db"))
	return err == nil
}

// watchPeers keeps the failing-peer table from raft's observations. A new
// leader starts with an empty table: a peer's grace period starts again from
// its first failed heartbeat under that leader.
func (n *Node) watchPeers(ctx context.Context, obs <-chan raft.Observation) {
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-obs:
			n.failMu.Lock()
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				if _, ok := n.failing[string(d.PeerID)]; !ok {
					since := d.LastContact
					if since.IsZero() {
						since = time.Now()
					}
					if n.failing == nil {
						n.failing = map[string]time.Time{}
					}
					n.failing[string(d.PeerID)] = since
				}
			case raft.ResumedHeartbeatObservation:
				delete(n.failing, string(d.PeerID))
			case raft.LeaderObservation:
				n.failing = nil
			}
			n.failMu.Unlock()
			if _, ok := o.Data.(raft.LeaderObservation); ok && n.cfg.LeaderChanged != nil {
				n.cfg.LeaderChanged()
			}
		}
	}
}

// FailingPeers returns, while this node leads, the members whose heartbeats
// fail and the time of their last contact (or of the first failure seen).
func (n *Node) FailingPeers() map[string]time.Time {
	n.failMu.Lock()
	defer n.failMu.Unlock()
	out := make(map[string]time.Time, len(n.failing))
	for id, t := range n.failing {
		out[id] = t
	}
	return out
}
