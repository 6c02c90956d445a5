package fleet

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/policy"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// maxMessageBytes bounds one SandboxService message, as the host agent
// does.
const maxMessageBytes = 64 << 20

// Cluster is this node's Raft member, as the fleet uses it (*raftfsm.Node).
type Cluster interface {
	raftfsm.Applier
	// Read runs fn over this node's state (a stale read, in memory).
	Read(fn func(v raftfsm.View))
	// Changed returns a channel closed at this node's next state change:
	// take it before reading what you wait for.
	Changed() <-chan struct{}
	IsLeader() bool
}

// Sessions is what the fleet needs of the session records (PostgreSQL).
type Sessions interface {
	// Existing reports which of ids name a session that exists, in any
	// tenant.
	Existing(ctx context.Context, ids []string) (map[string]bool, error)
	// NeedsSandbox reports whether the session's agent uses the sandbox
	// tools (ctx carries the session's tenant).
	NeedsSandbox(ctx context.Context, sessionID string) (bool, error)
	// Archived reports which of ids name an archived session, in any
	// tenant, and when each was archived.
	Archived(ctx context.Context, ids []string) (map[string]time.Time, error)
}

// Notices records in a session's event log what happened to its sandbox.
type Notices interface {
	// Rescheduled records that the session's sandbox was placed anew on
	// host to, empty, after its host from was lost.
	Rescheduled(ctx context.Context, t tenant.ID, sessionID, from, to string) error
	// Moved records that a drain moved the session's sandbox from host
	// from to host to, how as scheduler.Placement.Moved says (live, with
	// its workspace, or without it).
	Moved(ctx context.Context, t tenant.ID, sessionID, from, to, how string) error
}

// Config configures a Fleet. Zero fields take the defaults noted.
type Config struct {
	// Cluster is this node's Raft member. Required.
	Cluster Cluster
	// Credentials are the transport credentials for a host's
	// SandboxService (mutual TLS with this node's control-plane
	// certificate; controlplane/hosts issues them). Required.
	Credentials func(hostID string) credentials.TransportCredentials
	// Request is the template of the sandbox request of the node's
	// default class: runtime, image, resources. Its runtime must be one
	// admission knows. Without Classes every session gets it; with them it
	// still sizes a turn's early quota check (Admit) and stands for the
	// runtime of placements recorded without one.
	Request scheduler.Request
	// Classes, when set, resolves each session's sandbox class (policy
	// classes.yaml), whose request its sandbox gets; the class's policy
	// decides the tenant's trust, so TrustedOnly and Trusted are unused.
	Classes Classes
	// Scheduler weighs placements; every replica re-plans with it.
	Scheduler scheduler.Config
	// RealModel is set when sessions run a real model: their sandboxes
	// never go to a process host unless AllowProcess.
	RealModel, AllowProcess bool
	// TrustedOnly is set when policy marks the runtime of Request
	// trusted_only; Trusted then says whether a tenant's policy grants it
	// (admission.CheckTrustedRuntime). Trusted is required with TrustedOnly.
	TrustedOnly bool
	Trusted     func(tenantID string) bool
	// Placement is where a tenant's sandboxes may go (policy
	// placement.yaml: its host pools, zone spread): applied to every
	// placement the fleet asks for, first or a move. Nil: any host.
	Placement func(tenantID string) policy.Placement
	// ObservePlace, when set, receives each Place once it is settled: its
	// outcome (placed; existing: the session had one; no_capacity: no
	// host or quota has room; refused: policy forbids it; unavailable;
	// canceled; error) and how long planning and committing took. It
	// must not block (metrics).
	ObservePlace func(outcome string, d time.Duration)
	// DialOptions are added to the options of every connection to a
	// host's SandboxService (tracing's stats handler, which sends the
	// calls' trace context). Optional.
	DialOptions []grpc.DialOption
	// ReadyTimeout bounds the wait for a new sandbox, and a tool call's
	// wait for a mover or for its host to come back. Default 2m.
	ReadyTimeout time.Duration
	// SweepInterval is how often the leader releases the placements of
	// sessions that no longer exist. Default 5s.
	SweepInterval time.Duration
	// Blobs carries workspaces during a drain and keeps their snapshots.
	// Required for Drain and for snapshots.
	Blobs blob.Store
	// Snapshots records the workspace snapshots (snapshot.go). Nil: none
	// are taken, and a sandbox placed anew starts empty.
	Snapshots Snapshots
	// SnapshotInterval is how often a running command's workspace is
	// snapshotted (besides at the end of every turn that changed it).
	// Default 1m; negative: only at the end of turns.
	SnapshotInterval time.Duration
	// AllowedHosts returns a session's egress allowlist (its
	// environment's limited networking; empty: no network), read when its
	// sandbox is placed; the placement carries it to the host. Optional:
	// without it no sandbox has a network.
	AllowedHosts func(ctx context.Context, sessionID string) ([]string, error)
	// Sessions and Notices are the session records and their event log.
	// Required.
	Sessions Sessions
	Notices  Notices
	// Forget is told of each session whose sandbox the fleet let go
	// because the session is gone (the tools forget its shell state).
	// Optional.
	Forget func(sessionID string)
	// PauseAfterIdle pauses the sandbox of a session idle this long
	// (SessionIdle; gVisor sandboxes only): runtimes.yaml's
	// pause_after_idle_seconds. Zero never pauses.
	PauseAfterIdle time.Duration
	// ArchiveReleaseAfter is how long the sandbox of an archived session
	// is kept (paused where it can be) before it is released
	// (SessionArchived): runtimes.yaml's archive_release_after_seconds.
	// Zero releases it at once.
	ArchiveReleaseAfter time.Duration
	// Builds are the environment package builds (build.go). Nil: no
	// session has a build, and RunBuilds returns at once.
	Builds Builds
	// BuildRetention is how long a build no session pins is kept after it
	// was last asked for (SweepBuilds). Default 24h.
	BuildRetention time.Duration
	// BuildRequest is the template of a build sandbox's request: the
	// node's gVisor class's runtime, provider and limits. Required with
	// Builds.
	BuildRequest scheduler.Request
	// Mounts are the sessions' file resources and outputs (mounts.go).
	// Nil: nothing is mounted in sandboxes and nothing is published.
	Mounts Mounts
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 2 * time.Minute
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 5 * time.Second
	}
	if c.BuildRetention == 0 {
		c.BuildRetention = 24 * time.Hour
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	if c.Forget == nil {
		c.Forget = func(string) {}
	}
}

// Validate reports the first mistake in c.
func (c *Config) Validate() error {
	switch {
	case c.Cluster == nil:
		return errdefs.InvalidArgument("fleet: a raft node is required")
	case c.Credentials == nil:
		return errdefs.InvalidArgument("fleet: host credentials are required")
	case c.Sessions == nil || c.Notices == nil:
		return errdefs.InvalidArgument("fleet: the session records are required")
	case c.ReadyTimeout < 0 || c.SweepInterval < 0 || c.PauseAfterIdle < 0 || c.ArchiveReleaseAfter < 0 || c.BuildRetention < 0:
		return errdefs.InvalidArgument("fleet: intervals must not be negative")
	case c.Builds != nil && c.BuildRequest.Runtime != admission.RuntimeGVisor:
		return errdefs.InvalidArgument("fleet: environment builds run in gVisor sandboxes: BuildRequest needs the gvisor runtime")
	case c.TrustedOnly && c.Trusted == nil:
		return errdefs.InvalidArgument("fleet: a trusted_only runtime needs the tenants' grants")
	}
	return admission.CheckRuntime(c.Request.Runtime)
}

// Fleet is one control-plane node's side of its sessions' sandboxes.
type Fleet struct {
	cfg  Config
	node Cluster
	log  *slog.Logger

	// mu guards the fields below.
	mu sync.Mutex
	// conns are the SandboxService connections, one per host.
	conns map[string]*conn
	// used is the placement each session's last tool call on this node
	// found, to tell a sandbox replaced after its host was lost (kept in
	// memory: a node that takes a session over does not know where its
	// earlier calls ran).
	used map[string]scheduler.Placement
	// idle are the pause timers of this node's idle sessions (SessionIdle).
	idle map[string]*time.Timer
	// mounted is what this node last staged into each session's sandbox
	// (mounts.go).
	mounted map[string]mountState

	snaps snapshotter

	builds builds

	// preparing are the sessions whose sandbox Prepare is placing;
	// prepares counts those goroutines, which Close waits for.
	preparing map[string]bool
	prepares  sync.WaitGroup

	// ctx ends at Close: idle pauses and Prepare's placements run under it.
	ctx    context.Context
	cancel context.CancelFunc
}

type conn struct {
	addr   string
	cc     *grpc.ClientConn
	client pb.SandboxServiceClient
}

// New builds a Fleet. Run starts its sweep; Close ends its connections.
func New(cfg Config) (*Fleet, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Fleet{cfg: cfg, node: cfg.Cluster, log: cfg.Logger,
		conns: map[string]*conn{}, used: map[string]scheduler.Placement{}, idle: map[string]*time.Timer{},
		mounted: map[string]mountState{}, builds: newBuilds(), preparing: map[string]bool{},
		ctx: ctx, cancel: cancel}, nil
}

// Run sweeps, while this node leads, the placements of deleted sessions
// until ctx ends.
func (f *Fleet) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !f.node.IsLeader() {
			continue
		}
		if err := f.Sweep(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("releasing the sandboxes of deleted sessions", "err", err)
		}
	}
}

// Close closes the connections to hosts.
func (f *Fleet) Close() {
	f.mu.Lock() // Prepare starts nothing once ctx has ended
	f.cancel()
	f.mu.Unlock()
	f.prepares.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, t := range f.idle {
		t.Stop()
		delete(f.idle, id)
	}
	for id, c := range f.conns {
		c.cc.Close()
		delete(f.conns, id)
	}
}

// client returns the SandboxService client of a host at addr, reusing its
// connection; a host that registered a new address gets a new one. The
// connection retries quickly (a host agent restarting comes back within
// seconds), so that waiting callers reconnect soon after it does.
func (f *Fleet) client(hostID, addr string) (pb.SandboxServiceClient, error) {
	if addr == "" {
		return nil, errdefs.FailedPrecondition("host %s has not registered a sandbox service address", hostID)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.conns[hostID]; c != nil {
		if c.addr == addr {
			return c.client, nil
		}
		c.cc.Close()
		delete(f.conns, hostID)
	}
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(f.cfg.Credentials(hostID)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
	}, f.cfg.DialOptions...)...)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "sandbox address %s of host %s", addr, hostID)
	}
	c := &conn{addr: addr, cc: cc, client: pb.NewSandboxServiceClient(cc)}
	f.conns[hostID] = c
	return c.client, nil
}

// hostClient is client for a host as this node's state knows it.
func (f *Fleet) hostClient(hostID string) (pb.SandboxServiceClient, error) {
	var (
		addr string
		ok   bool
	)
	f.node.Read(func(v raftfsm.View) {
		var h *scheduler.Host
		if h, ok = v.Host(hostID); ok {
			addr = h.Address
		}
	})
	if !ok {
		return nil, errdefs.NotFound("host %s", hostID)
	}
	return f.client(hostID, addr)
}

// placement reads a session's placement and its host's address ("" when
// the host is unknown or down).
func (f *Fleet) placement(sessionID string) (p scheduler.Placement, addr string, ok bool) {
	f.node.Read(func(v raftfsm.View) {
		if p, ok = v.Placement(sessionID); ok {
			if h, hok := v.Host(p.HostID); hok && h.Status != scheduler.StatusDown {
				addr = h.Address
			}
		}
	})
	return p, addr, ok
}
