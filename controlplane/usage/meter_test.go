package usage_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/usage"
)

type fakeCluster struct {
	mu      sync.Mutex
	leader  bool
	term    uint64
	ps      []scheduler.Placement
	changed chan struct{}
}

func (c *fakeCluster) Placements() []scheduler.Placement {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]scheduler.Placement(nil), c.ps...)
}

func (c *fakeCluster) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *fakeCluster) IsLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *fakeCluster) Term() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term
}

func (c *fakeCluster) set(leader bool, ps ...scheduler.Placement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader, c.ps = leader, ps
	close(c.changed)
	c.changed = make(chan struct{})
}

// fakeStore keeps intervals as the migration does: one open per session,
// a repeated state changes nothing.
type fakeStore struct {
	mu     sync.Mutex
	open   map[string]store.SandboxInterval
	closed []store.SandboxInterval // Since..(the close's at) in ends
	ends   []time.Time
	fail   error
	failed chan struct{}
	term   uint64 // the last claimed
	writes int
	wrote  chan struct{}
}

func (s *fakeStore) SetSandboxState(ctx context.Context, term uint64, sessionID, state, hostID string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if term != s.term {
		return store.ErrStaleMeter
	}
	if s.fail != nil {
		select {
		case s.failed <- struct{}{}:
		default:
		}
		return s.fail
	}
	s.writes++
	t, _ := tenant.From(ctx)
	if cur, ok := s.open[sessionID]; ok && (state == "" || cur.State != state || cur.HostID != hostID) {
		s.closed, s.ends = append(s.closed, cur), append(s.ends, at)
		delete(s.open, sessionID)
	}
	if _, ok := s.open[sessionID]; !ok && state != "" {
		s.open[sessionID] = store.SandboxInterval{Tenant: t, SessionID: sessionID, State: state, HostID: hostID, Since: at}
	}
	select {
	case s.wrote <- struct{}{}:
	default:
	}
	return nil
}

func (s *fakeStore) ClaimMeter(_ context.Context, term uint64) ([]store.SandboxInterval, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if term < s.term {
		return nil, store.ErrStaleMeter
	}
	s.term = term
	var out []store.SandboxInterval
	for _, i := range s.open {
		out = append(out, i)
	}
	return out, nil
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type observed struct {
	mu   sync.Mutex
	secs map[string]time.Duration // tenant/state
}

func (o *observed) observe(t tenant.ID, state string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.secs[string(t)+"/"+state] += d
}

func (o *observed) get(k string) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.secs[k]
}

func setup(t *testing.T) (*fakeCluster, *fakeStore, *clock, *observed, func(c *fakeCluster) *usage.Meter) {
	t.Helper()
	st := &fakeStore{open: map[string]store.SandboxInterval{}, wrote: make(chan struct{}, 1), failed: make(chan struct{}, 1)}
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	obs := &observed{secs: map[string]time.Duration{}}
	build := func(c *fakeCluster) *usage.Meter {
		m, err := usage.New(usage.Config{Cluster: c, Store: st, Now: clk.now, Observe: obs.observe, RetryAfter: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	return &fakeCluster{leader: true, term: 1, changed: make(chan struct{})}, st, clk, obs, build
}

func placed(session string, ready bool, state, host string) scheduler.Placement {
	return scheduler.Placement{SessionID: session, Tenant: "tenant_a", HostID: host, Ready: ready, State: state}
}

// The meter follows placements through ready, pause, resume, a move and
// release; a new leader carries the open interval on without a second
// one; a follower writes nothing.
func TestMeterFollowsPlacements(t *testing.T) {
	c, st, clk, obs, build := setup(t)
	m := build(c)
	ctx := context.Background()
	step := func() {
		t.Helper()
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.set(true, placed("s1", false, "", "h1"))
	step()
	if len(st.open) != 0 {
		t.Fatalf("a placement not ready opened %v", st.open)
	}
	c.set(true, placed("s1", true, "", "h1"))
	step()
	step() // nothing changed: no write
	if st.writes != 1 || st.open["s1"].State != store.SandboxRunning {
		t.Fatalf("after ready: %d writes, open %v", st.writes, st.open)
	}
	clk.add(time.Minute)
	c.set(true, placed("s1", true, scheduler.PlacementPaused, "h1"))
	step()
	clk.add(2 * time.Minute)
	c.set(true, placed("s1", true, "", "h1"))
	step()
	clk.add(time.Minute)
	m.Flush()
	if got := obs.get("tenant_a/running"); got != 2*time.Minute {
		t.Errorf("running counted %v, want 2m", got)
	}
	if got := obs.get("tenant_a/paused"); got != 2*time.Minute {
		t.Errorf("paused counted %v, want 2m", got)
	}

	// A new leader: the old one stops, the new one loads the open
	// interval and writes nothing new.
	c.set(false, placed("s1", true, "", "h1"))
	step()
	writes := st.writes
	c2 := &fakeCluster{leader: true, term: 2, changed: make(chan struct{})}
	c2.set(true, placed("s1", true, "", "h1"))
	m2 := build(c2)
	if err := m2.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if st.writes != writes || len(st.open) != 1 {
		t.Errorf("the new leader wrote %d times; open %v", st.writes-writes, st.open)
	}
	// A move: closed on h1, open again once ready on h2; release closes.
	clk.add(time.Minute)
	c2.set(true, placed("s1", false, "", "h2"))
	if err := m2.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.open) != 0 {
		t.Errorf("open during the move: %v", st.open)
	}
	c2.set(true, placed("s1", true, "", "h2"))
	if err := m2.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if st.open["s1"].HostID != "h2" {
		t.Errorf("after the move, open %v", st.open)
	}
	c2.set(true)
	if err := m2.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.open) != 0 || len(st.closed) != 4 {
		t.Errorf("after release: open %v, closed %v", st.open, st.closed)
	}
	// The first leader counted 2m running up to its last flush, the
	// second 1m more before the move.
	if got := obs.get("tenant_a/running"); got != 3*time.Minute {
		t.Errorf("running counted %v, want 3m", got)
	}
}

// A deposed leader that still believes it leads is fenced out by the new
// one's claim: its write is refused, and it lets go of what it held.
func TestMeterStaleLeaderIsFenced(t *testing.T) {
	c, st, clk, _, build := setup(t)
	old := build(c)
	ctx := context.Background()
	c.set(true, placed("s1", true, "", "h1"))
	if err := old.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	c2 := &fakeCluster{leader: true, term: 2, changed: make(chan struct{})}
	c2.set(true, placed("s1", true, scheduler.PlacementPaused, "h1"))
	if err := build(c2).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// The old leader's stale FSM still shows it running, later paused
	// there too: its writes are refused.
	clk.add(time.Minute)
	c.set(true, placed("s1", true, "", "h2"))
	if err := old.Sync(ctx); !errors.Is(err, store.ErrStaleMeter) {
		t.Fatalf("the stale leader's sync: %v", err)
	}
	if i := st.open["s1"]; i.State != store.SandboxPaused || i.HostID != "h1" {
		t.Errorf("the record after the stale write: %+v", i)
	}
	// It claims again (its term is older): refused too.
	if err := old.Sync(ctx); !errors.Is(err, store.ErrStaleMeter) {
		t.Fatalf("the stale leader's claim: %v", err)
	}
}

// Run wakes on the FSM's signal, and a failed write is tried again.
func TestMeterRunRetries(t *testing.T) {
	c, st, _, _, build := setup(t)
	m := build(c)
	st.fail = errors.New("database away")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	c.set(true, placed("s1", true, "", "h1"))
	select {
	case <-st.failed:
	case <-time.After(30 * time.Second):
		t.Fatal("the meter never tried to write")
	}
	st.mu.Lock()
	st.fail = nil
	st.mu.Unlock()
	select {
	case <-st.wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("no write after the database came back")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.open["s1"].State != store.SandboxRunning {
		t.Errorf("open %v", st.open)
	}
}
