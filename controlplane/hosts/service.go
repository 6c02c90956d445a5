package hosts

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Protocol constants shared with the host agent (hostagent/agent), which
// this package may not import.
const (
	// keepaliveMinTime admits the agents' pings (every 30s).
	keepaliveMinTime = 15 * time.Second
	// maxHostServiceMessageBytes bounds one message a host sends to
	// HostService (registrations, heartbeats, results: all small); gRPC's
	// default, set explicitly so that it is a decision.
	maxHostServiceMessageBytes = 4 << 20
)

// Config configures a Service. Zero fields take the defaults noted.
type Config struct {
	// Node is this control-plane node's Raft node. Required.
	Node *raftfsm.Node
	// Advertise is the HostService address hosts can dial on this node,
	// given to hosts by followers when this node leads (default: the
	// listener's address; required when that is unspecified, like :8442).
	Advertise string
	// HeartbeatInterval is what hosts are told (default 10s).
	HeartbeatInterval time.Duration
	// HostTTL: a host not heard from for this long is marked down (default
	// 3 × HeartbeatInterval).
	HostTTL time.Duration
	// LeaderGrace: no host is marked down until this long after this node
	// became leader, so hosts have time to reconnect (default HostTTL).
	LeaderGrace time.Duration
	// Overcommit is the fleet's overcommit ratios (policy/runtimes.yaml): a
	// host's capacity for placements is what it offers times these,
	// computed here, once, when it registers; the host is told the result
	// (Registered.schedulable), so that its own admission check agrees.
	// Zero: none.
	Overcommit scheduler.Overcommit
	// OnHostDown is called, on the leader, for each host that is down and
	// still holds placements, at every check until it holds none: the
	// fleet moves them (fleet.Reschedule). Optional.
	OnHostDown func(ctx context.Context, hostID string)
	// OnEvicted is called, on the leader, for each placement whose sandbox
	// the host reports evicted (under memory or disk pressure), until the
	// placement is gone: the fleet releases it at once, freeing its
	// capacity and quota, and the session's next tool call gets a new
	// sandbox with its last workspace snapshot (fleet.ReleaseEvicted).
	// Optional.
	OnEvicted func(ctx context.Context, hostID, sessionID string)
	// OnEgress is called with each heartbeat's egress audit records (at
	// most maxEgressPerHeartbeat; more are counted as dropped), only those
	// of sessions placed on the host and with the placement's tenant
	// (egress.go), and the count the host dropped. It must not block: the
	// heartbeat waits for it. It calls ack once the records are stored:
	// the host holds them, and sends them again, until then (a record may
	// so come more than once; it carries an id to dedupe on). Not calling
	// ack (a full queue, a failed write) loses nothing. Optional.
	OnEgress func(hostID string, recs []*pb.EgressRecord, dropped int64, ack func())
	// ObserveEgressRejected counts egress records rejected (egress.go), by
	// reason (EgressNotPlaced, EgressTenantMismatch). Optional.
	ObserveEgressRejected func(reason string, n int)
	// EgressGrace is how long after a placement is gone it still vouches
	// for its host's egress records (default DefaultEgressGrace).
	EgressGrace time.Duration
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.HostTTL == 0 {
		c.HostTTL = 3 * c.HeartbeatInterval
	}
	if c.LeaderGrace == 0 {
		c.LeaderGrace = c.HostTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.OnHostDown == nil {
		c.OnHostDown = func(context.Context, string) {}
	}
	if c.OnEvicted == nil {
		c.OnEvicted = func(context.Context, string, string) {}
	}
	if c.ObserveEgressRejected == nil {
		c.ObserveEgressRejected = func(string, int) {}
	}
	if c.EgressGrace == 0 {
		c.EgressGrace = DefaultEgressGrace
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
}

// Validate reports the first mistake in c.
func (c *Config) Validate() error {
	switch {
	case c.Node == nil:
		return errdefs.InvalidArgument("hosts: a raft node is required")
	case c.HeartbeatInterval < 0 || c.HostTTL < 0 || c.LeaderGrace < 0 || c.EgressGrace < 0:
		return errdefs.InvalidArgument("hosts: intervals must not be negative")
	case c.HostTTL > 0 && c.HeartbeatInterval > 0 && c.HostTTL <= c.HeartbeatInterval:
		return errdefs.InvalidArgument("hosts: the host TTL (%v) must be longer than the heartbeat interval (%v)", c.HostTTL, c.HeartbeatInterval)
	}
	return nil
}

// Service implements pb.HostServiceServer over the Raft FSM. New builds
// it; Serve starts it; Close stops it.
type Service struct {
	pb.UnimplementedHostServiceServer
	cfg  Config
	node *raftfsm.Node
	log  *slog.Logger

	ca   *hostpki.CA
	cert tls.Certificate // this node's control-plane certificate
	srv  *grpc.Server
	lis  net.Listener

	stop context.CancelFunc
	bg   sync.WaitGroup

	// mu guards the leader's memory below.
	mu sync.Mutex
	// streams are the connected hosts' streams, by host id.
	streams map[string]*stream
	// lastSeen is when each host last registered or heartbeat.
	lastSeen map[string]time.Time
	// leading and leaderSince: whether this node leads, and since when.
	leading     bool
	leaderSince time.Time
	// caughtUp: this node has applied all that was committed before its
	// term (reset when it becomes leader).
	caughtUp bool

	// dirty collects hosts whose placements changed (from the FSM watcher),
	// for the kick loop.
	dirtyMu  sync.Mutex
	dirty    map[string]bool
	dirtyAll bool
	dirtyCh  chan struct{} // capacity 1

	heartbeats atomic.Uint64 // received, since start

	// placed remembers the hosts' placements for their egress records
	// (egress.go).
	placed *placements
}

// New makes the Service: it loads the hosts' CA from the FSM, creating and
// committing one if there is none yet (this needs a leader; New waits for
// one until ctx ends), and issues this node's control-plane certificate.
func New(ctx context.Context, cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, node: cfg.Node, log: cfg.Logger.With("node_id", cfg.Node.ID()),
		streams: map[string]*stream{}, lastSeen: map[string]time.Time{},
		dirty: map[string]bool{}, dirtyCh: make(chan struct{}, 1), placed: newPlacements()}
	ca, err := s.loadCA(ctx)
	if err != nil {
		return nil, err
	}
	s.ca = ca
	if s.cert, err = ca.IssueControlPlane(0); err != nil {
		return nil, err
	}
	return s, nil
}

// loadCA returns the replicated CA, committing a new one if there is none.
// Its key travels and rests sealed with the node's seal key: a node with
// another key fails here, clearly.
func (s *Service) loadCA(ctx context.Context) (*hostpki.CA, error) {
	ring := s.node.Keyring()
	var have *raftfsm.HostCA
	s.node.Read(func(v raftfsm.View) { have = v.HostCA() })
	if have == nil {
		fresh, err := hostpki.NewCA("corral hosts CA")
		if err != nil {
			return nil, err
		}
		certPEM := hostpki.CertPEM(fresh.Cert.Raw)
		der, err := fresh.MarshalKey()
		if err != nil {
			return nil, err
		}
		sealed, err := ring.Seal(raftfsm.SealHostCAKey, der)
		clear(der)
		if err != nil {
			return nil, err
		}
		// The first CA committed wins: the result is that one.
		got, err := raftfsm.Apply(ctx, s.node, raftfsm.SetHostCA, "", raftfsm.HostCA{CertPEM: certPEM, Key: sealed})
		if err != nil {
			return nil, fmt.Errorf("committing the hosts' CA: %w", err)
		}
		have = &got
	}
	der, err := ring.Open(raftfsm.SealHostCAKey, have.Key)
	if err != nil {
		return nil, fmt.Errorf("cannot unseal host CA: %w", err)
	}
	defer clear(der)
	return hostpki.LoadCA(have.CertPEM, der)
}

// CA returns the hosts' CA (its certificate is the hosts' trust anchor).
func (s *Service) CA() *hostpki.CA { return s.ca }

// Serve serves HostService on l, records l's (or Config.Advertise's)
// address as this node's host endpoint through Raft, and starts the
// leader's timers. It returns at once; Close stops everything.
func (s *Service) Serve(l net.Listener) {
	s.lis = l
	s.srv = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(hostpki.ServerTLS(s.ca.Cert, s.cert, "", true))),
		grpc.MaxRecvMsgSize(maxHostServiceMessageBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer s.recoverTo(info.FullMethod, &err)
			resp, err = h(ctx, req)
			return resp, errgrpc.ToStatus(err, false)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer s.recoverTo(info.FullMethod, &err)
			return errgrpc.ToStatus(h(srv, ss), false)
		}),
	)
	pb.RegisterHostServiceServer(s.srv, s)
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.node.WatchPlacements(s.markDirty)
	s.bg.Go(func() {
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("serving the host service", "err", err)
		}
	})
	s.bg.Go(func() { s.announce(ctx) })
	s.bg.Go(func() { s.leaderLoop(ctx) })
	s.bg.Go(func() { s.kickLoop(ctx) })
}

// Addr is the address HostService listens on.
func (s *Service) Addr() string { return s.lis.Addr().String() }

// Close stops serving and the timers.
func (s *Service) Close() {
	if s.stop != nil {
		s.stop()
	}
	s.node.WatchPlacements(nil)
	if s.srv != nil {
		s.srv.Stop()
	}
	s.bg.Wait()
}

func (s *Service) recoverTo(method string, err *error) {
	if p := recover(); p != nil {
		s.log.Error("panic in host service handler", "method", method, "panic", p, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "internal error")
	}
}

// announce records this node's host endpoint in the replicated state.
func (s *Service) announce(ctx context.Context) {
	addr := s.cfg.Advertise
	if addr == "" {
		addr = s.lis.Addr().String()
		if host, _, err := net.SplitHostPort(addr); err != nil || net.ParseIP(host) == nil || net.ParseIP(host).IsUnspecified() {
			s.log.Error("the host service listens on an address hosts cannot dial and no advertise address is set: followers will not name this node to hosts", "addr", addr)
			return
		}
	}
	_, err := raftfsm.Apply(ctx, s.node, raftfsm.SetHostEndpoint, "host-endpoint/"+s.node.ID()+"/"+addr,
		raftfsm.HostEndpointPayload{NodeID: s.node.ID(), Addr: addr})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("announcing the host service address", "err", err)
	}
}

// leaderEndpoint is the leader's HostService address, or "".
func (s *Service) leaderEndpoint() string {
	id := s.node.Leader()
	if id == "" {
		return ""
	}
	var addr string
	s.node.Read(func(v raftfsm.View) { addr = v.HostEndpoint(id) })
	return addr
}

// IssueToken makes a one-time join token valid for ttl and records its
// hash through Raft.
func (s *Service) IssueToken(ctx context.Context, ttl time.Duration) (hostpki.JoinToken, error) {
	if ttl <= 0 {
		return hostpki.JoinToken{}, errdefs.InvalidArgument("a join token needs a positive lifetime")
	}
	tok, err := hostpki.NewJoinToken(s.ca)
	if err != nil {
		return hostpki.JoinToken{}, err
	}
	now := s.cfg.Now()
	p := raftfsm.AddJoinTokenPayload{Hash: hostpki.TokenHash(tok.Secret), Expires: now.Add(ttl), Now: now}
	if _, err := raftfsm.Apply(ctx, s.node, raftfsm.AddJoinToken, "token/"+p.Hash, p); err != nil {
		return hostpki.JoinToken{}, err
	}
	return tok, nil
}

// Join signs a new host's CSR once its token is consumed through Raft. A
// bad CSR is refused before the token is spent.
func (s *Service) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	der, err := s.ca.SignHost(req.CsrDer, req.HostId, 0)
	if err != nil {
		return nil, err
	}
	// No idempotency key: a retried Join finds the token used, rather than
	// a leaked used token being replayable for the host's identity.
	p := raftfsm.ConsumeJoinTokenPayload{Hash: hostpki.TokenHash(logging.Secret(req.Token)), HostID: req.HostId, Now: s.cfg.Now()}
	if _, err := raftfsm.Apply(ctx, s.node, raftfsm.ConsumeJoinToken, "", p); err != nil {
		return nil, err
	}
	s.log.Info("host joined", "host_id", req.HostId)
	return &pb.JoinResponse{CertificateDer: der, CaCertificateDer: s.ca.Cert.Raw}, nil
}
