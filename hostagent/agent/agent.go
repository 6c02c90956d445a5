package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/metrics"
	"corral.dev/corral/internal/tracing"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// KeepaliveTime is how often the agent pings the control plane on an idle
// connection. The control plane's server must permit it
// (keepalive.EnforcementPolicy MinTime at most this).
const KeepaliveTime = 30 * time.Second

// MaxMessageBytes bounds one SandboxService message, and so the files
// ReadFile and WriteFile move in one call.
const MaxMessageBytes = 64 << 20

// Agent is one host agent. New prepares it; Run runs it until its context
// ends.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	store *sandbox.Store

	// uploads serialise each sandbox's uploads calls (session.go).
	uploads uploadLocks

	ca   *x509.Certificate
	cert tls.Certificate

	lis       net.Listener
	grpc      *grpc.Server
	unlock    func() // releases the state dir
	closeOnce sync.Once

	// metrics are the agent's collectors; metricsLn serves them (nil
	// without Config.MetricsAddr).
	metrics   *hostMetrics
	metricsLn *metrics.Listener
	// tracing exports the SandboxService's spans (nil without
	// Config.Tracing.Endpoint).
	tracing *tracing.Provider

	// ctx ends when the agent closes; executions run under it.
	ctx    context.Context
	stop   context.CancelFunc
	execWG sync.WaitGroup // running executions

	// mu guards boxes, evictions, pressurePauses, execs and placed.
	mu        sync.Mutex
	boxes     map[string]*box       // by key
	evictions []*pb.Eviction        // since the last heartbeat
	execs     map[string]*execTable // by sandbox key, loaded on first use
	// pressurePauses are the sandboxes paused under pressure since the
	// last heartbeat (pressure.go).
	pressurePauses []*pb.PressurePause
	// placed are the keys the control plane places here, as of the last
	// Registered and the assignments since; nil until the first Registered.
	placed map[string]bool
	// schedulable is what the control plane schedules against here (the
	// allocatable resources times its overcommit ratios), from the last
	// Registered; a zero field is cfg.Allocatable's.
	schedulable Resources

	// reconcileMu serialises changes to the set of sandboxes (assignments,
	// evictions, reconciliation).
	reconcileMu sync.Mutex

	// pool is the warm pool (pool.go).
	pool *pool

	// nets are the sandboxes' egress networks and the host's egress audit
	// queue (egress.go).
	nets *networks

	// health is each provider's last canary outcome, by name, and
	// healthChanged is closed (and replaced) when one changes; both
	// guarded by mu. canaryMu serialises runs of the canaries.
	health        map[string]providerHealth
	healthChanged chan struct{}
	canaryMu      sync.Mutex

	// builds holds a token while an image build runs (build.go): one at
	// a time.
	builds chan struct{}
}

// reconciler is a driver that can remove half-made sandboxes left by a
// crash (the containerd driver); the agent calls it once, before attaching.
type reconciler interface {
	Reconcile(ctx context.Context) (removedIDs []string, err error)
}

// box is a sandbox the agent holds.
type box struct {
	rec      sandbox.Record
	sb       driver.Sandbox // nil unless rec.State is Ready
	inflight int            // commands running now
	evicting bool           // being evicted: no new commands
	pausing  bool           // being paused: no new commands
	// restoring: taking another host's checkpoint (RestoreCheckpoint),
	// counted in inflight meanwhile: no new calls.
	restoring bool
	// fencedUntil: a control-plane node is moving the sandbox; until then
	// it takes no new calls (see Fence). idle, while a Fence waits, is
	// closed when inflight reaches zero.
	fencedUntil time.Time
	idle        chan struct{}
}

// New validates cfg, obtains the host certificate (joining with the token if
// the state dir has none), attaches to the sandboxes recorded in the state
// dir and opens the SandboxService listener. It does not contact the control
// plane otherwise.
func New(ctx context.Context, cfg Config) (*Agent, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	a, err := newLocked(ctx, cfg)
	if err != nil {
		unlock()
		return nil, err
	}
	a.unlock = unlock
	return a, nil
}

// lockStateDir takes the state dir's lock, so that two agents never drive
// the same sandboxes. The kernel drops it when the process dies, kill -9
// included.
func lockStateDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the state dir's lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errdefs.FailedPrecondition("another corral host is running with state dir %s", dir)
		}
		return nil, fmt.Errorf("locking the state dir: %w", err)
	}
	return func() { f.Close() }, nil
}

func newLocked(ctx context.Context, cfg Config) (*Agent, error) {
	nets, err := newNetworks()
	if err != nil {
		return nil, err
	}
	store, err := sandbox.OpenStore(cfg.recordsDir())
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("host_id", cfg.HostID), store: store, boxes: map[string]*box{}, nets: nets, execs: map[string]*execTable{},
		pool: newPool(&cfg), health: map[string]providerHealth{}, healthChanged: make(chan struct{}),
		builds: make(chan struct{}, 1)}
	a.metrics = newHostMetrics(a)
	if err := a.loadOrJoin(ctx); err != nil {
		return nil, err
	}
	for _, d := range a.drivers() {
		r, ok := d.(reconciler)
		if !ok {
			continue
		}
		removed, err := r.Reconcile(ctx)
		if err != nil {
			return nil, fmt.Errorf("removing half-made sandboxes of %s: %w", d.Name(), err)
		}
		if len(removed) > 0 {
			a.log.Info("removed half-made sandboxes", "ids", removed)
		}
		for _, id := range removed {
			// A build the agent's crash interrupted: its network too,
			// keyed by the build sandbox's id (build.go).
			if strings.HasPrefix(id, driver.BuildIDPrefix) {
				if err := egress.Remove(ctx, id); err != nil {
					a.log.Warn("removing an interrupted build's egress network", "id", id, "err", err)
				}
			}
		}
	}
	if err := a.sweepForgottenExecutions(); err != nil {
		return nil, fmt.Errorf("removing the kept executions of destroyed sandboxes: %w", err)
	}
	if err := a.attachRecorded(ctx); err != nil {
		return nil, err
	}
	if err := a.recoverPool(ctx); err != nil {
		return nil, err
	}
	a.lis = cfg.Listener
	if a.lis == nil {
		if a.lis, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "listening for the sandbox service on %s", cfg.ListenAddr)
		}
	}
	if cfg.MetricsAddr != "" {
		if a.metricsLn, err = metrics.Listen(cfg.MetricsAddr, a.metrics.reg, nil, a.log); err != nil {
			a.lis.Close()
			return nil, err
		}
		if !metrics.IsLoopback(cfg.MetricsAddr) {
			a.log.Warn("INSECURE: serving metrics in plaintext beyond loopback (--metrics-insecure-listen)", "addr", a.metricsLn.Addr())
		}
	}
	tc := cfg.Tracing
	tc.ServiceName, tc.NodeID, tc.Version, tc.Logger = "corral-host", cfg.HostID, cfg.Version, a.log
	if a.tracing, err = tracing.Start(ctx, tc); err != nil {
		a.lis.Close()
		if a.metricsLn != nil {
			a.metricsLn.Close(ctx)
		}
		return nil, err
	}
	tlsCfg := hostpki.ServerTLS(a.ca, a.cert, hostpki.ControlPlaneName, false)
	a.grpc = NewGRPCServer(a.log, append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		// Close returns once no handler runs: none writes the state dir
		// after it.
		grpc.WaitForHandlers(true)}, a.tracing.ServerOptions()...)...)
	pb.RegisterSandboxServiceServer(a.grpc, &sandboxServer{a: a})
	a.ctx, a.stop = context.WithCancel(context.Background())
	return a, nil
}

// Close stops the sandbox service, kills the commands still running
// through it (as the agent's exit would) and releases the state dir; Run
// does it when it returns. Sandboxes live on.
func (a *Agent) Close() {
	a.closeOnce.Do(func() {
		a.stop()
		// The handlers first (their RPCs cancelled, each waited for),
		// then the executions, which a handler may have started.
		a.grpc.Stop()
		a.execWG.Wait()
		a.lis.Close()
		a.closeNetworks()
		if a.metricsLn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			a.metricsLn.Close(ctx)
			cancel()
		}
		if a.tracing != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := a.tracing.Shutdown(ctx); err != nil {
				a.log.Warn("stopping the trace exporter", "err", err)
			}
			cancel()
		}
		a.unlock()
	})
}

// MetricsURL is the URL of the agent's /metrics, or "" without
// Config.MetricsAddr.
func (a *Agent) MetricsURL() string {
	if a.metricsLn == nil {
		return ""
	}
	return a.metricsLn.URL()
}

// SandboxAddr is the address SandboxService listens on.
func (a *Agent) SandboxAddr() string { return a.lis.Addr().String() }

// Run serves SandboxService and keeps a stream open to the control plane,
// reconnecting when it breaks, until ctx ends. Sandboxes live on after Run
// returns.
func (a *Agent) Run(ctx context.Context) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- a.grpc.Serve(a.lis) }()
	if a.metricsLn != nil {
		go func() {
			if err := a.metricsLn.Serve(); err != nil {
				a.log.Error("the metrics listener stopped", "err", err)
			}
		}()
	}
	defer a.Close()
	reapCtx, stopReaping := context.WithCancel(ctx)
	var reaping sync.WaitGroup
	reaping.Go(func() { a.reapLoop(reapCtx) })
	reaping.Go(func() { a.poolLoop(reapCtx) })
	defer reaping.Wait()
	defer stopReaping()
	// The first Register carries every provider's health: a broken
	// provider takes no placement, not even the first.
	a.CheckProviders(reapCtx)
	reaping.Go(func() { a.canaryLoop(reapCtx) })

	conns := map[string]*grpc.ClientConn{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	client := func(addr string) (pb.HostServiceClient, error) {
		if c := conns[addr]; c != nil {
			return pb.NewHostServiceClient(c), nil
		}
		c, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(a.ca, &a.cert, hostpki.ControlPlaneName))),
			// A silent network partition ends the stream within about 40s.
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: 10 * time.Second, PermitWithoutStream: true}))
		if err != nil {
			return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "control plane address %s", addr)
		}
		conns[addr] = c
		return pb.NewHostServiceClient(c), nil
	}
	addrs := a.cfg.controlPlanes()
	next, addr, followed := 0, addrs[0], false
	for {
		c, err := client(addr)
		registered := false
		if err == nil {
			registered, err = a.session(ctx, c)
		}
		if ctx.Err() != nil {
			return nil
		}
		if registered {
			followed = false // the hint that led here was good
		}
		// A follower names the leader (as does a leader that lost its
		// leadership): go there at once, unless the last attempt already
		// followed a hint and failed (hints can be stale mid-election).
		var hint *leaderHint
		if errors.As(err, &hint) && hint.addr != addr && !followed {
			a.log.Info("following the control plane's leader hint", "from", addr, "to", hint.addr)
			addr, followed = hint.addr, true
			continue
		}
		followed = false
		next = (next + 1) % len(addrs)
		a.log.Warn("control plane stream ended; reconnecting", "control_plane", addr, "err", err, "next", addrs[next], "delay", a.cfg.ReconnectDelay)
		addr = addrs[next]
		select {
		case <-ctx.Done():
			return nil
		case err := <-serveErr:
			return fmt.Errorf("sandbox service: %w", err)
		case <-a.cfg.After(a.cfg.ReconnectDelay):
		}
	}
}

// leaderHint is a stream's end with a pointer to the leader.
type leaderHint struct {
	err  error
	addr string
}

func (e *leaderHint) Error() string { return e.err.Error() }
func (e *leaderHint) Unwrap() error { return e.err }

// loadOrJoin reads the host certificate from the state dir, or joins.
func (a *Agent) loadOrJoin(ctx context.Context) error {
	dir := a.cfg.pkiDir()
	caPath, certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "host.pem"), filepath.Join(dir, "host-key.pem")
	if _, err := os.Stat(certPath); errors.Is(err, os.ErrNotExist) {
		if err := a.join(ctx, caPath, certPath, keyPath); err != nil {
			return err
		}
	}
	ca, err := hostpki.ReadCertPEM(caPath)
	if err != nil {
		return fmt.Errorf("reading CA certificate: %w", err)
	}
	leaf, err := hostpki.ReadCertPEM(certPath)
	if err != nil {
		return fmt.Errorf("reading host certificate: %w", err)
	}
	if leaf.Subject.CommonName != a.cfg.HostID {
		return errdefs.FailedPrecondition("the host certificate in %s is for %q, not %q; use that host id or a fresh state dir", dir, leaf.Subject.CommonName, a.cfg.HostID)
	}
	key, err := hostpki.ReadKeyPEM(keyPath)
	if err != nil {
		return fmt.Errorf("reading host key: %w", err)
	}
	a.ca = ca
	a.cert = tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	return nil
}

func (a *Agent) join(ctx context.Context, caPath, certPath, keyPath string) error {
	if a.cfg.JoinToken == "" {
		return errdefs.FailedPrecondition("this host has not joined yet (no certificate in %s): a join token is required", a.cfg.pkiDir())
	}
	tok, err := hostpki.ParseJoinToken(a.cfg.JoinToken.Reveal())
	if err != nil {
		return err
	}
	key, csr, err := hostpki.NewKeyAndCSR(a.cfg.HostID)
	if err != nil {
		return err
	}
	// Any node can answer Join; try each until one does.
	var resp *pb.JoinResponse
	for _, addr := range a.cfg.controlPlanes() {
		if resp, err = a.joinVia(ctx, addr, tok, csr); err == nil || errdefs.KindOf(err) != errdefs.UnavailableKind {
			break
		}
		a.log.Warn("joining through a control-plane node failed; trying the next", "control_plane", addr, "err", err)
	}
	if err != nil {
		return err
	}
	if hostpki.Pin(resp.CaCertificateDer) != tok.CAPin {
		return errdefs.PermissionDenied("the control plane returned a CA that does not match the join token")
	}
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		return err
	}
	if err := hostpki.WriteKeyPEM(keyPath, key); err != nil {
		return err
	}
	if err := hostpki.WriteFileAtomic(caPath, hostpki.CertPEM(resp.CaCertificateDer), 0o600); err != nil {
		return err
	}
	// The certificate last: its presence means "joined".
	if err := hostpki.WriteFileAtomic(certPath, hostpki.CertPEM(resp.CertificateDer), 0o600); err != nil {
		return err
	}
	a.log.Info("joined the control plane", "control_plane", a.cfg.ControlPlane)
	return nil
}

func (a *Agent) joinVia(ctx context.Context, addr string, tok hostpki.JoinToken, csr []byte) (*pb.JoinResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(hostpki.PinnedClientTLS(tok.CAPin))))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "control plane address %s", addr)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := pb.NewHostServiceClient(conn).Join(ctx, &pb.JoinRequest{Token: tok.Secret.Reveal(), HostId: a.cfg.HostID, CsrDer: csr})
	if err != nil {
		return nil, fmt.Errorf("joining the control plane at %s: %w", addr, errgrpc.FromStatus(err))
	}
	return resp, nil
}

// session runs one Connect stream until it breaks or ctx ends. registered
// says whether the control plane accepted the host's Register.
func (a *Agent) session(ctx context.Context, client pb.HostServiceClient) (registered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Connect(ctx)
	if err != nil {
		return false, errgrpc.FromStatus(err)
	}
	// A follower refuses the stream without reading Register: Send then
	// fails with io.EOF, and Recv has the real status and the leader hint.
	if err := stream.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Register{Register: a.register(ctx)}}); err != nil && !errors.Is(err, io.EOF) {
		return false, errgrpc.FromStatus(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return false, streamEnd(stream, err)
	}
	reg := first.GetRegistered()
	if reg == nil {
		return false, errdefs.FailedPrecondition("the control plane answered Register with %T, not Registered", first.GetMsg())
	}
	// With acks, egress records stay held until a heartbeat that carried
	// them is acknowledged.
	acks := reg.GetEgressAcks()
	interval := a.cfg.HeartbeatInterval
	if d := reg.GetHeartbeatInterval().AsDuration(); d > 0 {
		interval = d
	}
	s := reg.GetSchedulable()
	a.mu.Lock()
	a.schedulable = Resources{CPUMillis: s.GetCpuMillis(), MemoryBytes: s.GetMemoryBytes(), DiskBytes: s.GetDiskBytes()}
	a.mu.Unlock()
	a.log.Info("registered with the control plane", "heartbeat_interval", interval, "placed", len(reg.PlacedKeys),
		"schedulable_cpu_millis", s.GetCpuMillis(), "schedulable_memory_bytes", s.GetMemoryBytes())
	a.reconcile(ctx, reg.PlacedKeys)

	assignments := make(chan *pb.Assignment)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if ack := m.GetHeartbeatAck(); ack != nil {
				a.ackEgress(ack.Seq)
				continue
			}
			if as := m.GetAssignment(); as != nil {
				select {
				case assignments <- as:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	// Assignments run one at a time beside this loop, so that a slow one
	// (a sandbox booting, an image being unpacked) does not hold up the
	// heartbeats the control plane judges the host by. Every heartbeat sent
	// after a result reflects it: both leave from this loop.
	results := make(chan *pb.AssignmentResult)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case as := <-assignments:
				res := a.apply(ctx, as)
				select {
				case results <- res:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	tick, stop := a.cfg.NewTicker(interval)
	defer stop()
	// send sends m; when the control plane has ended the stream (Send says
	// io.EOF) the error is how it ended, as the receiving goroutine got it.
	send := func(m *pb.ConnectRequest) error {
		err := stream.Send(m)
		if err == nil {
			return nil
		}
		if !errors.Is(err, io.EOF) {
			return errgrpc.FromStatus(err)
		}
		select {
		case err := <-recvErr:
			return streamEnd(stream, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// A change of the warm pool's counts is sent at once, in a heartbeat
	// of its own: the scheduler's warm score should not wait for the tick.
	// (Taken before the first heartbeat, so no change falls between.)
	poolChanged := a.PoolChanged()
	// So is a change of a provider's health: a failed canary should stop
	// placements at once.
	healthChanged := a.HealthChanged()
	// A first heartbeat right away tells the control plane the state after
	// reconciliation.
	if err := send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: a.heartbeat(ctx, acks)}}); err != nil {
		return true, err
	}
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case err := <-recvErr:
			return true, streamEnd(stream, err)
		case res := <-results:
			if err := send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Result{Result: res}}); err != nil {
				return true, err
			}
		case <-healthChanged:
			healthChanged = a.HealthChanged()
			if err := send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: a.heartbeat(ctx, acks)}}); err != nil {
				return true, err
			}
		case <-poolChanged:
			poolChanged = a.PoolChanged()
			if err := send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: a.heartbeat(ctx, acks)}}); err != nil {
				return true, err
			}
		case <-tick:
			if err := send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: a.heartbeat(ctx, acks)}}); err != nil {
				return true, err
			}
		}
	}
}

// streamEnd is the error a Connect stream ended with, given what Recv
// returned: a refusal that names the leader (a follower's, or a leader's
// that lost its leadership) becomes a leaderHint.
func streamEnd(stream pb.HostService_ConnectClient, err error) error {
	if errors.Is(err, io.EOF) {
		err = errdefs.Unavailable("the control plane closed the stream")
	} else {
		err = errgrpc.FromStatus(err)
	}
	if l := stream.Trailer().Get(hostpki.LeaderMetadataKey); len(l) > 0 && l[0] != "" {
		return &leaderHint{err: err, addr: l[0]}
	}
	return err
}

func (a *Agent) register(ctx context.Context) *pb.Register {
	addr := a.cfg.AdvertiseAddr
	if addr == "" {
		addr = a.SandboxAddr()
	}
	var images []string
	if a.cfg.Images != nil {
		var err error
		if images, err = a.cfg.Images(ctx); err != nil {
			a.log.Warn("listing images", "err", err)
		}
	}
	return &pb.Register{
		HostId:         a.cfg.HostID,
		Version:        a.cfg.Version,
		Runtimes:       a.runtimeList(),
		GvisorPlatform: a.cfg.GVisorPlatform,
		Capacity:       resourcesPB(a.cfg.Capacity),
		Allocatable:    resourcesPB(a.cfg.Allocatable),
		Labels:         a.cfg.Labels,
		Images:         images,
		SandboxAddress: addr,
		Sandboxes:      a.statuses(),
		Pausable:       a.migrator() != nil,
		Providers:      a.providersPB(),
	}
}

// heartbeat checks pressure (evicting if needed) and health, and reports.
// acks says whether the control plane acknowledges egress (egressRecords).
func (a *Agent) heartbeat(ctx context.Context, acks bool) *pb.Heartbeat {
	now := a.cfg.Now()
	conds := a.relievePressure(ctx)
	a.metrics.observePressure(conds)
	for _, c := range a.cfg.Checks {
		cond := &pb.Condition{Type: c.Type, Ok: true, CheckedAt: timestamppb.New(now)}
		if err := c.Run(ctx); err != nil {
			cond.Ok, cond.Message = false, err.Error()
		}
		conds = append(conds, cond)
	}
	a.mu.Lock()
	ev, paused := a.evictions, a.pressurePauses
	a.evictions, a.pressurePauses = nil, nil
	a.mu.Unlock()
	var used *pb.Resources
	if a.cfg.Usage != nil {
		u, err := a.cfg.Usage(ctx)
		if err != nil {
			a.log.Warn("measuring usage", "err", err)
		} else {
			used = resourcesPB(u)
		}
	}
	seq, egressRecs, egressDropped := a.egressRecords(acks)
	return &pb.Heartbeat{
		Seq:            seq,
		Egress:         egressRecs,
		EgressDropped:  egressDropped,
		Used:           used,
		Allocated:      resourcesPB(a.allocated("")),
		Sandboxes:      a.statuses(),
		Conditions:     conds,
		Evictions:      ev,
		PressurePauses: paused,
		SentAt:         timestamppb.New(now),
		WarmPools:      a.warmPools(),
		Providers:      a.providerHealthPB(),
	}
}

func resourcesPB(r Resources) *pb.Resources {
	return &pb.Resources{CpuMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes}
}
