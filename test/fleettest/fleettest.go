// Package fleettest starts real control-plane nodes' fleet parts in
// process for tests: Raft nodes on loopback, each with its host service
// (controlplane/hosts) and its fleet (controlplane/fleet), and real host
// agents (hostagent/agent) that join them over mutual TLS. The session
// records the fleet asks about are kept in memory (Sessions); the server's
// tests run the same ports over PostgreSQL.
package fleettest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Tenant is the tenant of the sessions the helpers place.
const Tenant = tenant.ID("tenant_test")

// Options shape a cluster. Zero fields take the defaults noted.
type Options struct {
	// Nodes is how many control-plane nodes (default 1).
	Nodes int
	// Heartbeat is what hosts are told (default 100ms); a host is down
	// after HostTTL of silence (default 2s: slack for a busy machine) and
	// a new leader gives hosts Grace to reconnect (default 3s).
	Heartbeat, HostTTL, Grace time.Duration
	// Runtime and Image are what hosts offer and sessions ask for (default
	// process, no image); Resources what each sandbox takes.
	Runtime   string
	Image     string
	Resources scheduler.Resources
	// NewDriver makes each host agent's driver (default: the process
	// driver in a temporary directory).
	NewDriver func(t testing.TB) driver.Driver
	// ReadyTimeout is the fleets' (default 1m).
	ReadyTimeout time.Duration
	// OnEgress and ObserveEgressRejected are every host service's
	// (hosts.Config); nil: none.
	OnEgress              func(hostID string, recs []*pb.EgressRecord, dropped int64, ack func())
	ObserveEgressRejected func(reason string, n int)
}

// Cluster is a set of control-plane nodes with their fleets.
type Cluster struct {
	t     testing.TB
	opts  Options
	Blobs blob.Store
	// Sessions is the session records every fleet asks about.
	Sessions *Sessions

	// mu guards nodes, svcs and fleets: Kill clears a node's entries.
	mu     sync.Mutex
	nodes  []*raftfsm.Node
	svcs   []*hosts.Service
	fleets []*fleet.Fleet
	// stopDrains stops each fleet's RunDrains and waits for it.
	stopDrains []func()
	addrs      []string // host service addresses, by node
	// clients: SandboxClient's connections, by host and address.
	clients map[string]*grpc.ClientConn
}

// Start starts the cluster; everything stops when the test ends.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = 100 * time.Millisecond
	}
	if o.HostTTL == 0 {
		o.HostTTL = 2 * time.Second
	}
	if o.Grace == 0 {
		o.Grace = 3 * time.Second
	}
	if o.Runtime == "" {
		o.Runtime = "process"
	}
	if o.Resources == (scheduler.Resources{}) {
		o.Resources = scheduler.Resources{CPUMillis: 500, MemoryMiB: 256}
	}
	if o.NewDriver == nil {
		o.NewDriver = func(t testing.TB) driver.Driver {
			d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	blobs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, opts: o, Blobs: blobs, Sessions: NewSessions()}
	for i := range o.Nodes {
		cfg := raftfsm.Config{
			ID: fmt.Sprintf("n%d", i+1), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(),
			HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 1 * time.Second,
			LeaderLeaseTimeout: 150 * time.Millisecond, ApplyTimeout: 5 * time.Second,
		}
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			tok, err := c.nodes[0].IssueNodeToken(ctx, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Join, cfg.NodeJoinToken, cfg.Seal = c.nodes[0].HTTPAddr(), logging.Secret(tok.Reveal()), c.nodes[0].Keyring()
		}
		n, err := raftfsm.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Shutdown() })
		c.nodes = append(c.nodes, n)
		if i == 0 {
			waitfor.Cond(t, 20*time.Second, "the first node to lead", n.IsLeader)
		}
	}
	for i, n := range c.nodes {
		svc, err := hosts.New(ctx, hosts.Config{
			Node: n, HeartbeatInterval: o.Heartbeat, HostTTL: o.HostTTL, LeaderGrace: o.Grace,
			OnEgress: o.OnEgress, ObserveEgressRejected: o.ObserveEgressRejected,
			OnHostDown: func(ctx context.Context, hostID string) {
				if f := c.fleetAt(i); f != nil {
					f.Reschedule(ctx, hostID)
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		f, err := fleet.New(fleet.Config{
			Cluster: n, Credentials: svc.SandboxCredentials,
			Request:      scheduler.Request{Runtime: o.Runtime, Image: o.Image, Resources: o.Resources},
			ReadyTimeout: o.ReadyTimeout, Blobs: blobs, Sessions: c.Sessions, Notices: c.Sessions,
		})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		svc.Serve(l)
		t.Cleanup(svc.Close)
		t.Cleanup(f.Close)
		// Each fleet runs the drains while its node leads, as a server's does.
		dctx, cancel := context.WithCancel(context.Background())
		drainsDone := make(chan struct{})
		go func() { f.RunDrains(dctx); close(drainsDone) }()
		stop := sync.OnceFunc(func() { cancel(); <-drainsDone })
		t.Cleanup(stop)
		c.stopDrains = append(c.stopDrains, stop)
		c.svcs = append(c.svcs, svc)
		c.fleets = append(c.fleets, f)
		c.addrs = append(c.addrs, svc.Addr())
	}
	// Every node knows every node's host endpoint before hosts come.
	for _, n := range c.nodes {
		if err := n.Wait(ctx, func(v raftfsm.View) bool {
			for _, m := range c.nodes {
				if v.HostEndpoint(m.ID()) == "" {
					return false
				}
			}
			return true
		}); err != nil {
			t.Fatalf("host endpoints replicated to %s: %v", n.ID(), err)
		}
	}
	return c
}

func (c *Cluster) fleetAt(i int) *fleet.Fleet {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fleets[i]
}

// Leader returns the index of the live node that leads, waiting for one.
func (c *Cluster) Leader() int {
	c.t.Helper()
	idx := -1
	waitfor.Cond(c.t, 20*time.Second, "a leader", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, n := range c.nodes {
			if n != nil && n.IsLeader() {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

// Follower returns the index of a live node that does not lead (the
// leader when it is alone).
func (c *Cluster) Follower() int {
	l := c.Leader()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range c.nodes {
		if n != nil && i != l {
			return i
		}
	}
	return l
}

// Node, Hosts and Fleet return node i's parts (nil once killed).
func (c *Cluster) Node(i int) *raftfsm.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

func (c *Cluster) Hosts(i int) *hosts.Service {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.svcs[i]
}

func (c *Cluster) Fleet(i int) *fleet.Fleet { return c.fleetAt(i) }

// HostAddr is node i's host service address.
func (c *Cluster) HostAddr(i int) string { return c.addrs[i] }

// Kill stops node i: its fleet, host service and Raft member.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	f, svc, n, stop := c.fleets[i], c.svcs[i], c.nodes[i], c.stopDrains[i]
	c.fleets[i], c.svcs[i], c.nodes[i] = nil, nil, nil
	c.mu.Unlock()
	stop()
	f.Close()
	svc.Close()
	_ = n.Shutdown()
}

// Token issues a join token through a live node.
func (c *Cluster) Token() logging.Secret {
	c.t.Helper()
	tok, err := c.Hosts(c.Follower()).IssueToken(context.Background(), time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	return logging.Secret(tok.Reveal())
}

// Host is a running host agent.
type Host struct {
	ID       string
	StateDir string
	Driver   driver.Driver
	// Addr is its SandboxService address, fixed across restarts.
	Addr string

	c      *Cluster
	order  []int
	pools  []agent.PoolClass
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// HostOptions shape a host agent. Zero fields take the defaults noted.
type HostOptions struct {
	// Order lists the nodes whose host service addresses the agent knows,
	// in order (default: a follower first, the leader last).
	Order []int
	// ReconnectDelay is the agent's wait before the next address (default
	// 50ms).
	ReconnectDelay time.Duration
	// Capacity (default 4 CPUs, 8 GiB, 8 GiB of disk).
	Capacity agent.Resources
	// Pools are the agent's warm pool classes (default none); a restart
	// keeps them.
	Pools []agent.PoolClass
}

// StartHost joins a host agent, runs it and waits until the leader has its
// stream.
func (c *Cluster) StartHost(id string, o HostOptions) *Host {
	c.t.Helper()
	if o.Order == nil {
		l := c.Leader()
		for k := 1; k <= len(c.nodes); k++ {
			o.Order = append(o.Order, (l+k)%len(c.nodes))
		}
	}
	if o.Capacity == (agent.Resources{}) {
		o.Capacity = agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30}
	}
	if o.ReconnectDelay == 0 {
		o.ReconnectDelay = 50 * time.Millisecond
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h := &Host{ID: id, StateDir: c.t.TempDir(), Driver: c.opts.NewDriver(c.t), Addr: addr, c: c, order: o.Order, pools: o.Pools}
	h.start(c.Token(), o)
	// Sandboxes outlive their agents: before the agent stops at the test's
	// end, what is placed on it is released and destroyed.
	c.t.Cleanup(func() {
		c.DestroyOn(id)
		h.Stop()
	})
	c.WaitConnected(id)
	return h
}

func (h *Host) start(token logging.Secret, o HostOptions) {
	h.c.t.Helper()
	var addrs []string
	for _, i := range h.order {
		addrs = append(addrs, h.c.addrs[i])
	}
	a, err := agent.New(context.Background(), agent.Config{
		HostID: h.ID, ControlPlane: strings.Join(addrs, ","), JoinToken: token, StateDir: h.StateDir,
		ListenAddr: h.Addr, Driver: h.Driver, Runtime: h.c.opts.Runtime,
		Capacity: o.Capacity, ReconnectDelay: o.ReconnectDelay, Pools: h.pools,
	})
	if err != nil {
		h.c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	h.mu.Lock()
	h.cancel, h.done = cancel, done
	h.mu.Unlock()
}

// Stop stops the agent (its sandboxes stay, as after a crash).
func (h *Host) Stop() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.cancel = nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Restart stops the agent and starts it again on its state dir and
// address; it rejoins with the certificate it kept.
func (h *Host) Restart() {
	h.c.t.Helper()
	h.Stop()
	h.start("", HostOptions{Capacity: agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30}, ReconnectDelay: 50 * time.Millisecond})
}

// WaitConnected waits until the leader has the host's stream.
func (c *Cluster) WaitConnected(id string) {
	c.t.Helper()
	waitfor.Cond(c.t, 30*time.Second, "host "+id+" connected to the leader", func() bool {
		return c.Hosts(c.Leader()).Connected(id)
	})
}

// Placement reads a session's placement from node i.
func (c *Cluster) Placement(i int, sessionID string) (scheduler.Placement, bool) {
	var (
		p  scheduler.Placement
		ok bool
	)
	c.Node(i).Read(func(v raftfsm.View) { p, ok = v.Placement(sessionID) })
	return p, ok
}

// HostRecord reads a host from node i.
func (c *Cluster) HostRecord(i int, id string) scheduler.Host {
	var h scheduler.Host
	c.Node(i).Read(func(v raftfsm.View) {
		if p, ok := v.Host(id); ok {
			h = *p
		}
	})
	return h
}

// Ctx is a context of the test tenant, ended with the test.
func (c *Cluster) Ctx() context.Context {
	ctx, cancel := context.WithCancel(tenant.With(context.Background(), Tenant))
	c.t.Cleanup(cancel)
	return ctx
}

// Sessions is an in-memory fleet.Sessions and fleet.Notices: every session
// added exists until deleted, and every one uses the sandbox tools.
type Sessions struct {
	// mu guards the fields below.
	mu          sync.Mutex
	exist       map[string]bool
	archived    map[string]time.Time
	rescheduled map[string][]string // session id → "from>to"
	moved       map[string][]string // session id → "from>to:how"
	changed     chan struct{}
}

var (
	_ fleet.Sessions = (*Sessions)(nil)
	_ fleet.Notices  = (*Sessions)(nil)
)

// NewSessions returns an empty record.
func NewSessions() *Sessions {
	return &Sessions{exist: map[string]bool{}, archived: map[string]time.Time{}, rescheduled: map[string][]string{}, moved: map[string][]string{}, changed: make(chan struct{})}
}

// Add records sessions.
func (s *Sessions) Add(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.exist[id] = true
	}
}

// Delete forgets a session.
func (s *Sessions) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.exist, id)
	delete(s.archived, id)
}

// Archive marks a session archived now (archiving twice keeps the first
// time).
func (s *Sessions) Archive(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.archived[id]; !ok && s.exist[id] {
		s.archived[id] = time.Now()
	}
}

// Existing implements fleet.Sessions.
func (s *Sessions) Existing(_ context.Context, ids []string) (map[string]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, id := range ids {
		if s.exist[id] {
			out[id] = true
		}
	}
	return out, nil
}

// Archived implements fleet.Sessions.
func (s *Sessions) Archived(_ context.Context, ids []string) (map[string]time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]time.Time{}
	for _, id := range ids {
		if at, ok := s.archived[id]; ok {
			out[id] = at
		}
	}
	return out, nil
}

// NeedsSandbox implements fleet.Sessions.
func (s *Sessions) NeedsSandbox(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.exist[id] {
		return false, errdefs.NotFound("session %s", id)
	}
	return true, nil
}

// Rescheduled implements fleet.Notices.
func (s *Sessions) Rescheduled(_ context.Context, _ tenant.ID, id, from, to string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.exist[id] {
		return errdefs.NotFound("session %s", id)
	}
	s.rescheduled[id] = append(s.rescheduled[id], from+">"+to)
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// Moved implements fleet.Notices.
func (s *Sessions) Moved(_ context.Context, _ tenant.ID, id, from, to, how string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.exist[id] {
		return errdefs.NotFound("session %s", id)
	}
	s.moved[id] = append(s.moved[id], from+">"+to+":"+how)
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// MovedNotes returns the drain moves recorded for a session
// ("from>to:how").
func (s *Sessions) MovedNotes(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.moved[id]...)
}

// WaitRescheduled waits until the session's sandbox was recorded as moved
// off a lost host n times, and returns the moves ("from>to").
func (s *Sessions) WaitRescheduled(t testing.TB, id string, n int, d time.Duration) []string {
	t.Helper()
	timeout := time.After(d)
	for {
		s.mu.Lock()
		got, ch := append([]string(nil), s.rescheduled[id]...), s.changed
		s.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("session %s was not rescheduled %d times within %v (got %v)", id, n, d, got)
		}
	}
}

// SandboxClient dials a host's SandboxService as a control-plane node
// does (for tests that look at one host's sandboxes directly). The
// connection is kept for the test.
func (c *Cluster) SandboxClient(hostID string) pb.SandboxServiceClient {
	c.t.Helper()
	i := c.Leader()
	addr := c.HostRecord(i, hostID).Address
	if addr == "" {
		c.t.Fatalf("host %s has no sandbox address", hostID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := hostID + "@" + addr
	if cc := c.clients[key]; cc != nil {
		return pb.NewSandboxServiceClient(cc)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.svcs[i].SandboxCredentials(hostID)))
	if err != nil {
		c.t.Fatal(err)
	}
	if c.clients == nil {
		c.clients = map[string]*grpc.ClientConn{}
	}
	c.clients[key] = cc
	c.t.Cleanup(func() { cc.Close() })
	return pb.NewSandboxServiceClient(cc)
}

// Sandbox places the session's sandbox through node i's fleet, as a tool
// call does, and returns it once usable. The session is recorded as
// existing. (When the test ends, each host's placements are released
// before it stops: see StartHost.)
func (c *Cluster) Sandbox(i int, sessionID string) tools.Sandbox {
	c.t.Helper()
	c.Sessions.Add(sessionID)
	ctx, cancel := context.WithTimeout(c.Ctx(), 2*time.Minute)
	defer cancel()
	sb, err := c.Fleet(i).SandboxFor(ctx, sessionID)
	if err != nil {
		c.t.Fatalf("the sandbox of %s: %v", sessionID, err)
	}
	if r, ok := sb.(tools.Replaced); ok {
		return r.Sandbox
	}
	return sb
}

// DestroyOn releases every placement on a host and waits until the host
// has destroyed its sandboxes (unless the host is down).
func (c *Cluster) DestroyOn(hostID string) {
	c.t.Helper()
	var ids []string
	c.Node(c.Leader()).Read(func(v raftfsm.View) {
		for _, p := range v.HostPlacements(hostID) {
			ids = append(ids, p.SessionID)
		}
	})
	for _, id := range ids {
		c.Destroy(id)
	}
}

// Destroy releases a session's sandbox and waits until its host has
// destroyed it. A session without a placement is left alone.
func (c *Cluster) Destroy(sessionID string) {
	c.t.Helper()
	i := c.Leader()
	p, ok := c.Placement(i, sessionID)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Fleet(i).Release(ctx, sessionID); err != nil && !errdefs.IsNotFound(err) {
		c.t.Errorf("releasing the sandbox of %s: %v", sessionID, err)
		return
	}
	if c.HostRecord(i, p.HostID).Status == scheduler.StatusDown {
		return // its agent is gone; the host reaps it when it comes back
	}
	waitfor.Cond(c.t, time.Minute, "the sandbox of "+sessionID+" to be destroyed on "+p.HostID, func() bool {
		_, err := c.ReadFile(p.HostID, sessionID, ".")
		return errdefs.IsNotFound(err)
	})
}

// ReadFile reads a file of a session's sandbox on one host (errdefs kinds
// kept).
func (c *Cluster) ReadFile(hostID, sessionID, path string) (string, error) {
	r, err := c.SandboxClient(hostID).ReadFile(context.Background(), &pb.ReadFileRequest{Key: sessionID, Path: path})
	return string(r.GetData()), errgrpc.FromStatus(err)
}

// SessionRecords are what a Sessions conformance run is given: the ports
// under test, and a way to make and delete sessions whose agents use the
// sandbox tools.
type SessionRecords struct {
	Sessions fleet.Sessions
	Notices  fleet.Notices
	// Create makes a session in tenant t and returns its id.
	Create func(t *testing.T) (tenant.ID, string)
	// Delete deletes one.
	Delete func(t *testing.T, t2 tenant.ID, sessionID string)
	// Archive archives one.
	Archive func(t *testing.T, t2 tenant.ID, sessionID string)
}

// CheckSessions is the conformance body every fleet.Sessions and
// fleet.Notices pair passes: this package's in-memory one and the
// server's over PostgreSQL.
func CheckSessions(t *testing.T, r SessionRecords) {
	ctx := context.Background()
	ta, a := r.Create(t)
	tb, b := r.Create(t)
	got, err := r.Sessions.Existing(ctx, []string{a, b, "sesn_none"})
	if err != nil || len(got) != 2 || !got[a] || !got[b] {
		t.Fatalf("Existing(%s, %s, sesn_none) = %v, %v", a, b, got, err)
	}
	if need, err := r.Sessions.NeedsSandbox(tenant.With(ctx, ta), a); err != nil || !need {
		t.Fatalf("NeedsSandbox(%s) = %v, %v; want true", a, need, err)
	}
	if err := r.Notices.Rescheduled(ctx, tb, b, "h1", "h2"); err != nil {
		t.Fatalf("Rescheduled(%s): %v", b, err)
	}
	if got, err := r.Sessions.Archived(ctx, []string{a, b}); err != nil || len(got) != 0 {
		t.Fatalf("Archived(%s, %s) before any archive = %v, %v", a, b, got, err)
	}
	before := time.Now()
	r.Archive(t, ta, a)
	got2, err := r.Sessions.Archived(ctx, []string{a, b, "sesn_none"})
	// (The database's clock may be a little off this process's.)
	if at, ok := got2[a]; err != nil || len(got2) != 1 || !ok || at.Before(before.Add(-time.Minute)) || at.After(time.Now().Add(time.Minute)) {
		t.Fatalf("Archived(%s, %s, sesn_none) after archiving %s at %v = %v, %v", a, b, a, before, got2, err)
	}
	if got, err := r.Sessions.Existing(ctx, []string{a}); err != nil || !got[a] {
		t.Fatalf("Existing(%s) of an archived session = %v, %v", a, got, err)
	}
	r.Delete(t, tb, b)
	if got, err := r.Sessions.Existing(ctx, []string{a, b}); err != nil || len(got) != 1 || !got[a] {
		t.Fatalf("Existing after deleting %s = %v, %v", b, got, err)
	}
	if _, err := r.Sessions.NeedsSandbox(tenant.With(ctx, tb), b); !errdefs.IsNotFound(err) {
		t.Fatalf("NeedsSandbox of a deleted session: %v, want not found", err)
	}
	if err := r.Notices.Rescheduled(ctx, tb, b, "h1", "h2"); !errdefs.IsNotFound(err) {
		t.Fatalf("Rescheduled of a deleted session: %v, want not found", err)
	}
	if got, err := r.Sessions.Existing(ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("Existing of none = %v, %v", got, err)
	}
}
