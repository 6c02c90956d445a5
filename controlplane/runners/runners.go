package runners

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/tracing"
)

// Cluster is the Raft node, as the manager needs it (*raftfsm.Node).
type Cluster interface {
	// Applier commits runner assignments (raftfsm.Apply).
	raftfsm.Applier
	ID() string
	IsLeader() bool
	// Read runs fn over this node's replicated state.
	Read(fn func(v raftfsm.View))
	// Status lists the members of the Raft configuration.
	Status() (raftfsm.Status, error)
	// FailingPeers returns, on the leader, the members whose heartbeats fail
	// and since when.
	FailingPeers() map[string]time.Time
}

// Config configures a Manager.
type Config struct {
	Cluster Cluster
	// Claim records the runner's epoch for the session in the database
	// (store.Events.ClaimRunner); an older epoch is refused with an error
	// whose chain holds store.ErrStaleRunner.
	Claim func(ctx context.Context, sessionID string, epoch int64) error
	// Pending lists the sessions whose loops have work
	// (store.Store.SessionsNeedingRunner).
	Pending func(ctx context.Context) ([]store.TenantSession, error)
	// Wake starts a session's loop on this node (agentloop.Pool.WakeFrom):
	// ctx carries the trace context of the input that woke it, if any (it
	// never ends: the loop outlives the request).
	Wake func(ctx context.Context, t tenant.ID, sessionID string)
	// Grace is how long a member's heartbeats may fail before the leader
	// moves its sessions. Default 5s.
	Grace time.Duration
	// Interval is how often the leader looks for sessions to move and every
	// node for sessions newly assigned to it. Default 1s.
	Interval time.Duration
	Logger   *slog.Logger
}

// Manager assigns session runners and resumes the loops assigned to this
// node. Its Lock is the agent loop pool's LockFunc.
type Manager struct {
	cfg Config
	log *slog.Logger

	// seen is touched only by Run's goroutine: the epochs of this node's
	// assignments already resumed.
	seen map[string]uint64

	// claimedMu guards claimed: the epoch this node last claimed in the
	// database for each session, so that a loop woken again under the same
	// epoch does not write it again. (A newer runner's claim elsewhere
	// needs a newer epoch in Raft first, which Lock sees.)
	claimedMu sync.Mutex
	claimed   map[string]uint64
}

// New returns a manager; call Run to keep assignments current.
func New(cfg Config) *Manager {
	if cfg.Grace == 0 {
		cfg.Grace = 5 * time.Second
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, log: cfg.Logger, seen: map[string]uint64{}, claimed: map[string]uint64{}}
}

func (m *Manager) assignment(sessionID string) (a raftfsm.RunnerAssignment, ok bool) {
	m.cfg.Cluster.Read(func(v raftfsm.View) { a, ok = v.Runner(sessionID) })
	return a, ok
}

// assign moves the session to node if its epoch is still ifEpoch, and
// returns the assignment now in force.
func (m *Manager) assign(ctx context.Context, sessionID, node string, ifEpoch uint64) (raftfsm.RunnerAssignment, error) {
	// Apply waits until this node has applied the assignment too, so that
	// its Lock sees what the leader just decided.
	key := fmt.Sprintf("runner/%s/%d/%s", sessionID, ifEpoch, node)
	a, err := raftfsm.Apply(ctx, m.cfg.Cluster, raftfsm.AssignRunner, key, raftfsm.AssignRunnerPayload{SessionID: sessionID, NodeID: node, IfEpoch: &ifEpoch})
	if err != nil {
		return a, fmt.Errorf("assigning the runner of session %s: %w", sessionID, err)
	}
	return a, nil
}

// live returns the ids of the members in the configuration whose
// heartbeats have not failed for longer than the grace period (as this node
// knows; only the leader sees failures).
func (m *Manager) live() (map[string]bool, error) {
	st, err := m.cfg.Cluster.Status()
	if err != nil {
		return nil, err
	}
	failing := m.cfg.Cluster.FailingPeers()
	out := map[string]bool{}
	for _, mem := range st.Members {
		if since, ok := failing[mem.ID]; !ok || time.Since(since) < m.cfg.Grace {
			out[mem.ID] = true
		}
	}
	return out, nil
}

// Lock is the agentloop.LockFunc: it lets this node run the session's loop
// only as the session's assigned runner, taking unassigned sessions and
// those of nodes that left, and claims the epoch in the database. The loop
// runs under a context carrying the epoch, which its appends check.
func (m *Manager) Lock(ctx context.Context, sessionID string) (context.Context, func(), bool, error) {
	me := m.cfg.Cluster.ID()
	a, ok := m.assignment(sessionID)
	if !ok || a.NodeID != me {
		live, err := m.live()
		if err != nil {
			return nil, nil, false, err
		}
		if ok && live[a.NodeID] {
			return nil, nil, false, nil // another live node runs it
		}
		if a, err = m.assign(ctx, sessionID, me, a.Epoch); err != nil {
			return nil, nil, false, err
		}
		if a.NodeID != me {
			return nil, nil, false, nil
		}
	}
	if err := m.claim(ctx, sessionID, a.Epoch); err != nil {
		if errors.Is(err, store.ErrStaleRunner) {
			return nil, nil, false, nil
		}
		return nil, nil, false, err
	}
	return events.WithRunnerEpoch(ctx, int64(a.Epoch)), func() {}, true, nil
}

// maxClaimed bounds the claims remembered; past it they are forgotten (and
// made again at the sessions' next wake).
const maxClaimed = 100_000

// claim records this node's epoch for the session in the database, unless
// it did already.
func (m *Manager) claim(ctx context.Context, sessionID string, epoch uint64) error {
	m.claimedMu.Lock()
	done := m.claimed[sessionID] == epoch
	m.claimedMu.Unlock()
	if done {
		return nil
	}
	if err := m.cfg.Claim(ctx, sessionID, int64(epoch)); err != nil {
		return err
	}
	m.claimedMu.Lock()
	if len(m.claimed) >= maxClaimed {
		clear(m.claimed)
	}
	m.claimed[sessionID] = epoch
	m.claimedMu.Unlock()
	return nil
}

// Prepare takes, in the background, the runner role of a session just
// created through this node, and claims its epoch in the database: its
// first input, which most likely comes to this node too, then wakes its
// loop without committing an assignment and a claim first. A session
// assigned already is left alone, and what fails is left for its first
// input to do (WakeForInput and Lock do it all again).
func (m *Manager) Prepare(t tenant.ID, sessionID string) {
	go func() {
		ctx, cancel := context.WithTimeout(tenant.With(context.Background(), t), 30*time.Second)
		defer cancel()
		if _, ok := m.assignment(sessionID); ok {
			return
		}
		me := m.cfg.Cluster.ID()
		a, err := m.assign(ctx, sessionID, me, 0)
		if err == nil && a.NodeID == me {
			err = m.claim(ctx, sessionID, a.Epoch)
		}
		if err != nil {
			m.log.Debug("taking a new session's runner role; its first input does", "session_id", sessionID, "err", err)
		}
	}()
}

// WakeForInput is the wake for new input a client sent to this node: the
// node takes the session's runner role (unless it holds it), then wakes
// the loop. A runner elsewhere stops at its next append.
//
// reqCtx is the request's: the loop's steps continue its trace. That is
// sound across nodes because the runner follows the input: the wake is
// always this node's own, never sent to another. A loop that resumes
// elsewhere (its node gone, the session handed over) starts traces of its
// own; the request it would continue is long over.
func (m *Manager) WakeForInput(reqCtx context.Context, t tenant.ID, sessionID string) {
	origin := tracing.Detach(reqCtx)
	go func() {
		me := m.cfg.Cluster.ID()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, _ := m.assignment(sessionID)
		// This node's view may lag: a compare-and-set that fails returns
		// the leader's current assignment, to try again from.
		for range 5 {
			if a.NodeID == me {
				break
			}
			var err error
			if a, err = m.assign(ctx, sessionID, me, a.Epoch); err != nil {
				m.log.Warn("taking over a session's runner", "session_id", sessionID, "err", err)
				break
			}
		}
		m.cfg.Wake(origin, t, sessionID)
	}()
}

// Run keeps assignments current until ctx ends: on the leader it moves the
// sessions of nodes gone or failing past the grace period; on every node it
// resumes loops newly assigned here.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if m.cfg.Cluster.IsLeader() {
			if err := m.reassign(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("moving sessions off departed nodes", "err", err)
			}
		}
		if err := m.resume(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("resuming sessions assigned here", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reassign moves every session whose runner is not live to the live node
// with the fewest sessions.
func (m *Manager) reassign(ctx context.Context) error {
	live, err := m.live()
	if err != nil || len(live) == 0 {
		return err
	}
	var orphans []raftfsm.RunnerAssignment
	load := map[string]int{}
	m.cfg.Cluster.Read(func(v raftfsm.View) {
		for _, a := range v.Runners() {
			if live[a.NodeID] {
				load[a.NodeID]++
			} else {
				orphans = append(orphans, a)
			}
		}
	})
	nodes := make([]string, 0, len(live))
	for id := range live {
		nodes = append(nodes, id)
	}
	sort.Strings(nodes)
	for _, a := range orphans {
		target := nodes[0]
		for _, id := range nodes[1:] {
			if load[id] < load[target] {
				target = id
			}
		}
		if _, err := m.assign(ctx, a.SessionID, target, a.Epoch); err != nil {
			return err
		}
		load[target]++
		m.log.Info("session runner moved", "session_id", a.SessionID, "from", a.NodeID, "to", target)
	}
	return nil
}

// resume wakes the loops of sessions with work that were assigned to this
// node since the last look.
func (m *Manager) resume(ctx context.Context) error {
	me := m.cfg.Cluster.ID()
	fresh := map[string]uint64{}
	m.cfg.Cluster.Read(func(v raftfsm.View) {
		for _, a := range v.Runners() {
			if a.NodeID == me && m.seen[a.SessionID] != a.Epoch {
				fresh[a.SessionID] = a.Epoch
			}
		}
	})
	if len(fresh) == 0 {
		return nil
	}
	pending, err := m.cfg.Pending(ctx)
	if err != nil {
		return errdefs.Wrap(errdefs.UnavailableKind, err, "listing sessions with work")
	}
	for _, ts := range pending {
		if _, ok := fresh[ts.SessionID]; ok {
			m.cfg.Wake(context.Background(), ts.Tenant, ts.SessionID)
		}
	}
	for id, e := range fresh {
		m.seen[id] = e
	}
	return nil
}
