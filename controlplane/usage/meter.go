package usage

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// Cluster is this node's Raft member, as the meter reads it (Raft adapts
// a *raftfsm.Node).
type Cluster interface {
	// Placements returns the placements in this node's state.
	Placements() []scheduler.Placement
	// Changed returns a channel closed at this node's next state change:
	// take it before reading.
	Changed() <-chan struct{}
	IsLeader() bool
	// Term is the current Raft term: while this node leads, its own.
	Term() uint64
}

// Raft is a Cluster over a Raft node.
type Raft struct{ Node *raftfsm.Node }

// Placements implements Cluster. A placement on a host that is down (its
// heartbeats stopped past their TTL) is left out: the host is lost, and
// its sandboxes count nothing until they are ready again, there or
// elsewhere.
func (r Raft) Placements() (out []scheduler.Placement) {
	r.Node.Read(func(v raftfsm.View) {
		for _, p := range v.Placements() {
			if h, ok := v.Host(p.HostID); ok && h.Status == scheduler.StatusDown {
				continue
			}
			out = append(out, p)
		}
	})
	return out
}

// Changed implements Cluster.
func (r Raft) Changed() <-chan struct{} { return r.Node.Changed() }

// IsLeader implements Cluster.
func (r Raft) IsLeader() bool { return r.Node.IsLeader() }

// Term implements Cluster.
func (r Raft) Term() uint64 { return r.Node.Term() }

// Store is the usage record (store.Usage).
type Store interface {
	// ClaimMeter fences out the meters of earlier terms and returns
	// every tenant's open intervals; a later term's claim refuses it
	// (store.ErrStaleMeter).
	ClaimMeter(ctx context.Context, term uint64) ([]store.SandboxInterval, error)
	// SetSandboxState records, for the meter of term, that the
	// session's sandbox (ctx carries its tenant) is in state on host
	// from at on; "" closes its interval. Repeating a call changes
	// nothing; a term fenced out is refused (store.ErrStaleMeter).
	SetSandboxState(ctx context.Context, term uint64, sessionID, state, hostID string, at time.Time) error
}

var _ Store = store.Usage{}

// Config configures a Meter.
type Config struct {
	Cluster Cluster // required
	Store   Store   // required
	// Observe, when set, receives the seconds a tenant's sandboxes spent
	// in state (store.SandboxRunning, store.SandboxPaused) since the
	// last call: the counters. It must not block.
	Observe func(t tenant.ID, state string, d time.Duration)
	// RetryAfter is how long the meter waits to write again after the
	// database refused a write (no signal says it is back). Default 2s.
	RetryAfter time.Duration
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// syncTimeout bounds one Sync's writes.
const syncTimeout = 30 * time.Second

// Meter keeps the sandbox intervals in PostgreSQL true to the leader's
// placements (doc.go).
type Meter struct {
	cfg    Config
	leader chan struct{} // LeaderChanged's signal, buffered 1

	// mu guards the fields below.
	mu sync.Mutex
	// open are the intervals PostgreSQL holds open, as this node loaded
	// or wrote them while it leads; nil while it does not (or has not
	// claimed the meter yet).
	open map[string]*interval
	// term is the Raft term the meter was claimed for.
	term uint64
}

type interval struct {
	tenant      tenant.ID
	state, host string
	// counted is how far Observe has been told of this interval.
	counted time.Time
}

// New builds a Meter; Run runs it.
func New(cfg Config) (*Meter, error) {
	if cfg.Cluster == nil || cfg.Store == nil {
		return nil, errdefs.InvalidArgument("usage: a raft node and a store are required")
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	if cfg.Observe == nil {
		cfg.Observe = func(tenant.ID, string, time.Duration) {}
	}
	return &Meter{cfg: cfg, leader: make(chan struct{}, 1)}, nil
}

// LeaderChanged wakes the meter: this node may have won or lost the lead
// (a leadership change applies no command, so the FSM does not signal
// it). It never blocks.
func (m *Meter) LeaderChanged() {
	select {
	case m.leader <- struct{}{}:
	default:
	}
}

// Run meters until ctx ends: at each change of the FSM or of leadership,
// and after a failed write, it brings the record in line (Sync).
func (m *Meter) Run(ctx context.Context) {
	defer m.stopLeading()
	for {
		changed := m.cfg.Cluster.Changed()
		var retry <-chan time.Time
		if err := m.Sync(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("metering sandbox time", "err", err)
			retry = time.After(m.cfg.RetryAfter)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-m.leader:
		case <-retry:
		}
	}
}

// Sync writes, while this node leads, what its placements say of each
// session's sandbox that the record does not yet say. A failed write is
// returned (all of them, joined) and tried again at the next Sync; the
// rest are still made. Each Sync reads every placement: the work is in
// memory, and only differences reach the database.
func (m *Meter) Sync(ctx context.Context) error {
	if !m.cfg.Cluster.IsLeader() {
		m.stopLeading()
		return nil
	}
	term := m.cfg.Cluster.Term()
	// A scrape's Flush waits for the lock: bound what a stuck database
	// holds it for.
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.open != nil && m.term != term {
		// Led again, in a later term: claim anew.
		m.stopLeadingLocked()
	}
	if m.open == nil {
		list, err := m.cfg.Store.ClaimMeter(ctx, term)
		if err != nil {
			return err
		}
		now := m.cfg.Now()
		m.term = term
		m.open = make(map[string]*interval, len(list))
		for _, i := range list {
			// The previous leader counted what came before.
			m.open[i.SessionID] = &interval{tenant: i.Tenant, state: i.State, host: i.HostID, counted: now}
		}
	}
	want := map[string]interval{}
	for _, p := range m.cfg.Cluster.Placements() {
		if !p.Ready || tenant.ID(p.Tenant).Validate() != nil {
			continue
		}
		st := store.SandboxRunning
		if p.Paused() {
			st = store.SandboxPaused
		}
		want[p.SessionID] = interval{tenant: tenant.ID(p.Tenant), state: st, host: p.HostID}
	}
	now := m.cfg.Now()
	var errs []error
	defer func() {
		for _, err := range errs {
			if errors.Is(err, store.ErrStaleMeter) {
				// A later leader meters: what this one holds is stale.
				m.stopLeadingLocked()
				return
			}
		}
	}()
	for id, w := range want {
		cur := m.open[id]
		if cur != nil && cur.state == w.state && cur.host == w.host && cur.tenant == w.tenant {
			continue
		}
		if cur != nil && cur.tenant != w.tenant {
			// Not seen: a session id is one tenant's. Close it where it
			// was written.
			if err := m.cfg.Store.SetSandboxState(tenant.With(ctx, cur.tenant), term, id, "", "", now); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := m.cfg.Store.SetSandboxState(tenant.With(ctx, w.tenant), term, id, w.state, w.host, now); err != nil {
			if errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
				errs = append(errs, err)
				continue
			}
			// The tenant is gone, and its usage with it: nothing to
			// record, nor to try again until its placement goes.
			m.cfg.Logger.Warn("not metering the sandbox of a deleted tenant", "session_id", id, "tenant", string(w.tenant))
		}
		if cur != nil {
			m.accrue(cur, now)
		}
		w.counted = now
		m.open[id] = &w
	}
	for id, cur := range m.open {
		if _, ok := want[id]; ok {
			continue
		}
		if err := m.cfg.Store.SetSandboxState(tenant.With(ctx, cur.tenant), term, id, "", "", now); err != nil {
			errs = append(errs, err)
			continue
		}
		m.accrue(cur, now)
		delete(m.open, id)
	}
	return errors.Join(errs...)
}

// Flush tells Observe of the open intervals' seconds up to now: a scrape
// calls it first.
func (m *Meter) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	for _, i := range m.open {
		m.accrue(i, now)
	}
}

// stopLeading flushes and forgets the open intervals: the next leader
// carries them on.
func (m *Meter) stopLeading() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopLeadingLocked()
}

// stopLeadingLocked is stopLeading with mu held.
func (m *Meter) stopLeadingLocked() {
	now := m.cfg.Now()
	for _, i := range m.open {
		m.accrue(i, now)
	}
	m.open = nil
}

// accrue tells Observe of i's seconds since it was last counted. Call with
// mu held.
func (m *Meter) accrue(i *interval, now time.Time) {
	if d := now.Sub(i.counted); d > 0 {
		m.cfg.Observe(i.tenant, i.state, d)
		i.counted = now
	}
}
