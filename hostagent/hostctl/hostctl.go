// Package hostctl is an in-repo test controller: the control plane's side of
// hostagent.v1, small enough to read in one sitting, for tests and for an
// operator trying a host by hand (`corral hostctl`). It keeps a CA and join
// tokens, accepts host streams, records what hosts report, pushes ensure and
// destroy assignments and calls a host's SandboxService with its
// control-plane certificate. State other than the CA lives in memory; a
// restarted hostctl adopts the sandboxes hosts report.
//
// The real control plane's side (placements through Raft, the scheduler)
// lives in controlplane/hosts; this package only needs to be faithful to the
// protocol.
//
// By hand, as root on a machine where scripts/runtime has started containerd:
//
//	corral hostctl serve --dir /tmp/ctl            # prints the address and a join token
//	corral host --control-plane 127.0.0.1:8442 --join-token corral1.… \
//	    --state-dir /tmp/host --host-id h1
//	corral hostctl --dir /tmp/ctl ensure --host h1 --key s1
//	corral hostctl --dir /tmp/ctl exec --host h1 --key s1 -- python3 -c 'print(6*7)'
//	kill -9 <corral host>; corral host --control-plane … --state-dir /tmp/host --host-id h1
//	corral hostctl --dir /tmp/ctl destroy --host h1 --key s1
package hostctl

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Config configures a Controller.
type Config struct {
	// Dir keeps the CA (ca.pem, ca-key.pem). Required.
	Dir string
	// HeartbeatInterval is what hosts are told (default 10s).
	HeartbeatInterval time.Duration
	Logger            *slog.Logger
}

// Validate reports the first mistake in c.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return errdefs.InvalidArgument("hostctl: a directory for the CA is required")
	}
	if c.HeartbeatInterval < 0 {
		return errdefs.InvalidArgument("hostctl: negative heartbeat interval")
	}
	return nil
}

// Host is what the controller knows of one host.
type Host struct {
	ID         string
	Connected  bool
	Registers  int // how many times it registered (one per stream)
	Heartbeats int // heartbeats received, over all streams
	Register   *pb.Register
	Last       *pb.Heartbeat      // latest heartbeat
	Evictions  []*pb.Eviction     // every eviction reported
	Egress     []*pb.EgressRecord // every egress record reported
	Placed     []string           // keys the controller placed there
	Results    int                // assignment results received
}

// Controller implements HostService.
type Controller struct {
	pb.UnimplementedHostServiceServer
	cfg    Config
	log    *slog.Logger
	ca     *hostpki.CA
	cert   tls.Certificate // the control plane's, server and client
	tokens *hostpki.Tokens

	// mu guards the fields below.
	mu      sync.Mutex
	hosts   map[string]*hostState
	changed chan struct{}   // closed and replaced on every change
	joined  map[string]bool // host ids that got a certificate
	nextID  int
	// schedulable is what hosts are told at their next registration that
	// the controller schedules against (nil: nothing, their own
	// allocatable).
	schedulable *pb.Resources
	// egressAcks is what hosts are told at their next registration
	// (Registered.egress_acks): that the controller acknowledges
	// heartbeats (AckHeartbeat), so they hold egress records until then.
	egressAcks bool
}

// SetEgressAcks sets whether hosts are told at their next registration
// that the controller acknowledges their heartbeats' egress
// (AckHeartbeat): they hold each record until a heartbeat that carried it
// is acknowledged. The controller acknowledges nothing by itself.
func (c *Controller) SetEgressAcks(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.egressAcks = on
}

// AckHeartbeat acknowledges the host's heartbeats up to seq on its
// current stream.
func (c *Controller) AckHeartbeat(ctx context.Context, hostID string, seq uint64) error {
	c.mu.Lock()
	h := c.hosts[hostID]
	if h == nil || h.send == nil {
		c.mu.Unlock()
		return errdefs.Unavailable("host %q is not connected", hostID)
	}
	send, gone := h.send, h.gone
	c.mu.Unlock()
	select {
	case send <- &pb.ConnectResponse{Msg: &pb.ConnectResponse_HeartbeatAck{HeartbeatAck: &pb.HeartbeatAck{Seq: seq}}}:
		return nil
	case <-gone:
		return errdefs.Unavailable("host %q disconnected", hostID)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetSchedulable sets what hosts are told at their next registration
// that the controller schedules against (Registered.schedulable), as a
// control plane does with its overcommit ratios applied; nil says nothing.
func (c *Controller) SetSchedulable(r *pb.Resources) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.schedulable = r
}

type hostState struct {
	Host
	placed  map[string]bool
	send    chan *pb.ConnectResponse // nil while disconnected
	gone    chan struct{}            // closed when the current stream ends
	pending map[string]chan *pb.AssignmentResult
}

// New loads or creates the CA in cfg.Dir.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	ca, err := hostpki.LoadOrCreateCA(cfg.Dir, "corral test controller CA")
	if err != nil {
		return nil, err
	}
	cert, err := ca.IssueControlPlane(0)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, log: cfg.Logger, ca: ca, cert: cert, tokens: hostpki.NewTokens(nil),
		hosts: map[string]*hostState{}, changed: make(chan struct{}), joined: map[string]bool{}}, nil
}

// CA returns the controller's CA.
func (c *Controller) CA() *hostpki.CA { return c.ca }

// IssueToken makes a one-time join token.
func (c *Controller) IssueToken(ttl time.Duration) (hostpki.JoinToken, error) {
	return c.tokens.Issue(c.ca, ttl)
}

// Serve serves HostService on l until it fails or Stop is called on the
// returned server.
func (c *Controller) Serve(l net.Listener) *grpc.Server {
	srv := agent.NewGRPCServer(c.log, grpc.Creds(credentials.NewTLS(hostpki.ServerTLS(c.ca.Cert, c.cert, "", true))),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: agent.KeepaliveTime / 2, PermitWithoutStream: true}))
	pb.RegisterHostServiceServer(srv, c)
	go func() {
		if err := srv.Serve(l); err != nil {
			c.log.Error("hostctl: serving", "err", err)
		}
	}()
	return srv
}

// Join consumes a token and signs the host's CSR.
func (c *Controller) Join(_ context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	if err := c.tokens.Consume(logging.Secret(req.Token)); err != nil {
		return nil, err
	}
	// A token is not bound to a host id, so the id must be new: otherwise a
	// token holder could take over a joined host's identity.
	c.mu.Lock()
	if c.joined[req.HostId] {
		c.mu.Unlock()
		return nil, errdefs.AlreadyExists("host %q has already joined; a host keeps its certificate in its state dir", req.HostId)
	}
	c.joined[req.HostId] = true
	c.mu.Unlock()
	der, err := c.ca.SignHost(req.CsrDer, req.HostId, 0)
	if err != nil {
		return nil, err
	}
	c.log.Info("host joined", "host_id", req.HostId)
	return &pb.JoinResponse{CertificateDer: der, CaCertificateDer: c.ca.Cert.Raw}, nil
}

// notifyLocked wakes Wait callers; c.mu must be held.
func (c *Controller) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Connect serves one host's stream.
func (c *Controller) Connect(stream pb.HostService_ConnectServer) error {
	id, err := hostpki.PeerName(stream.Context())
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	reg := first.GetRegister()
	if reg == nil {
		return errdefs.InvalidArgument("the first message on Connect must be Register")
	}
	if reg.HostId != id {
		return errdefs.PermissionDenied("host certificate is for %q but Register says %q", id, reg.HostId)
	}
	send, gone := make(chan *pb.ConnectResponse, 16), make(chan struct{})
	defer close(gone)
	c.mu.Lock()
	h := c.hosts[id]
	if h == nil {
		// A host this process has not seen: hostctl keeps placements in
		// memory only, so after hostctl restarts it adopts what the host
		// holds rather than have the host remove it all.
		h = &hostState{Host: Host{ID: id}, placed: map[string]bool{}, pending: map[string]chan *pb.AssignmentResult{}}
		for _, sb := range reg.Sandboxes {
			h.placed[sb.Key] = true
		}
		c.hosts[id] = h
	}
	h.Connected, h.Register, h.send, h.gone = true, reg, send, gone
	h.Registers++
	placed := slices.Sorted(maps.Keys(h.placed))
	schedulable, acks := c.schedulable, c.egressAcks
	c.notifyLocked()
	c.mu.Unlock()
	c.log.Info("host registered", "host_id", id, "sandboxes", len(reg.Sandboxes), "address", reg.SandboxAddress)
	defer func() {
		c.mu.Lock()
		if h.send == send {
			h.Connected, h.send = false, nil
		}
		c.notifyLocked()
		c.mu.Unlock()
	}()
	if err := stream.Send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_Registered{Registered: &pb.Registered{
		HeartbeatInterval: durationpb.New(c.cfg.HeartbeatInterval), PlacedKeys: placed, Schedulable: schedulable, EgressAcks: acks}}}); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		reported := false
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			c.record(h, m)
			// The first heartbeat on a stream is the host's state after it
			// reconciled: once this is logged, Hosts shows that state (what
			// a test reading the host after a restart waits for).
			if hb := m.GetHeartbeat(); hb != nil && !reported {
				reported = true
				c.log.Info("host reported its state", "host_id", id, "sandboxes", len(hb.Sandboxes))
			}
		}
	}()
	for {
		select {
		case err := <-recvErr:
			return err
		case m := <-send:
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

func (c *Controller) record(h *hostState, m *pb.ConnectRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch msg := m.Msg.(type) {
	case *pb.ConnectRequest_Heartbeat:
		h.Heartbeats++
		h.Last = msg.Heartbeat
		h.Evictions = append(h.Evictions, msg.Heartbeat.Evictions...)
		h.Egress = append(h.Egress, msg.Heartbeat.Egress...)
	case *pb.ConnectRequest_Result:
		h.Results++
		if ch := h.pending[msg.Result.AssignmentId]; ch != nil {
			ch <- msg.Result
			delete(h.pending, msg.Result.AssignmentId)
		}
	}
	c.notifyLocked()
}

// Hosts returns a copy of what the controller knows, by host id.
func (c *Controller) Hosts() map[string]Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]Host{}
	for id, h := range c.hosts {
		cp := h.Host
		cp.Placed = slices.Sorted(maps.Keys(h.placed))
		cp.Evictions = slices.Clone(h.Evictions)
		cp.Egress = slices.Clone(h.Egress)
		out[id] = cp
	}
	return out
}

// Wait blocks until cond holds for the known hosts, or ctx ends.
func (c *Controller) Wait(ctx context.Context, cond func(map[string]Host) bool) error {
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if cond(c.Hosts()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// assign sends one assignment to a connected host and waits for its result.
func (c *Controller) assign(ctx context.Context, hostID string, as *pb.Assignment) (*pb.AssignmentResult, error) {
	c.mu.Lock()
	h := c.hosts[hostID]
	if h == nil || h.send == nil {
		c.mu.Unlock()
		return nil, errdefs.Unavailable("host %q is not connected", hostID)
	}
	c.nextID++
	as.Id = "as-" + strconv.Itoa(c.nextID)
	ch := make(chan *pb.AssignmentResult, 1)
	h.pending[as.Id] = ch
	send, gone := h.send, h.gone
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(h.pending, as.Id)
		c.mu.Unlock()
	}()
	select {
	case send <- as2msg(as):
	case <-gone:
		return nil, errdefs.Unavailable("host %q disconnected", hostID)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-gone:
		return nil, errdefs.Unavailable("host %q disconnected before answering assignment %s", hostID, as.Id)
	case res := <-ch:
		if res.ErrorKind != "" {
			return res, &errdefs.Error{Kind: kindNamed(res.ErrorKind), Msg: res.ErrorMessage}
		}
		return res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func as2msg(as *pb.Assignment) *pb.ConnectResponse {
	return &pb.ConnectResponse{Msg: &pb.ConnectResponse_Assignment{Assignment: as}}
}

// Ensure places the sandbox on the host and waits until the host has it.
func (c *Controller) Ensure(ctx context.Context, hostID string, e *pb.EnsureSandbox) (*pb.SandboxStatus, error) {
	c.mu.Lock()
	h := c.hosts[hostID]
	wasPlaced := h != nil && h.placed[e.Key]
	if h != nil {
		h.placed[e.Key] = true
	}
	c.mu.Unlock()
	res, err := c.assign(ctx, hostID, &pb.Assignment{Action: &pb.Assignment_Ensure{Ensure: e}})
	if err != nil {
		if h != nil && !wasPlaced && res != nil { // the host refused: not placed
			c.mu.Lock()
			delete(h.placed, e.Key)
			c.mu.Unlock()
		}
		return nil, fmt.Errorf("ensuring sandbox %s on %s: %w", e.Key, hostID, err)
	}
	return res.Sandbox, nil
}

// Destroy unplaces the sandbox and waits until the host removed it.
func (c *Controller) Destroy(ctx context.Context, hostID, key string) error {
	c.mu.Lock()
	if h := c.hosts[hostID]; h != nil {
		delete(h.placed, key)
	}
	c.mu.Unlock()
	if _, err := c.assign(ctx, hostID, &pb.Assignment{Action: &pb.Assignment_Destroy{Destroy: &pb.DestroySandbox{Key: key}}}); err != nil {
		return fmt.Errorf("destroying sandbox %s on %s: %w", key, hostID, err)
	}
	return nil
}

// Place records that key is placed on hostID without telling the host: what
// a control plane remembers across a host's restart.
func (c *Controller) Place(hostID, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.hosts[hostID]
	if h == nil {
		h = &hostState{Host: Host{ID: hostID}, placed: map[string]bool{}, pending: map[string]chan *pb.AssignmentResult{}}
		c.hosts[hostID] = h
	}
	h.placed[key] = true
}

// Unplace forgets that key is placed on hostID without telling the host, as
// when the control plane moved the sandbox while the host was down.
func (c *Controller) Unplace(hostID, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.hosts[hostID]; h != nil {
		delete(h.placed, key)
	}
}

// DialSandbox connects to a host's SandboxService at addr (default: the
// address it registered) with the control plane's certificate.
func (c *Controller) DialSandbox(hostID, addr string) (pb.SandboxServiceClient, func() error, error) {
	if addr == "" {
		c.mu.Lock()
		if h := c.hosts[hostID]; h != nil && h.Register != nil {
			addr = h.Register.SandboxAddress
		}
		c.mu.Unlock()
	}
	if addr == "" {
		return nil, nil, errdefs.NotFound("host %q has not registered a sandbox address", hostID)
	}
	return DialSandbox(c.ca, c.cert, hostID, addr)
}

// DialSandbox connects to a host's SandboxService with cert, trusting ca.
func DialSandbox(ca *hostpki.CA, cert tls.Certificate, hostID, addr string) (pb.SandboxServiceClient, func() error, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(ca.Cert, &cert, hostID))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(agent.MaxMessageBytes), grpc.MaxCallSendMsgSize(agent.MaxMessageBytes)))
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "sandbox address %s", addr)
	}
	return pb.NewSandboxServiceClient(conn), conn.Close, nil
}

// kindNamed is the inverse of errdefs.Kind.String.
func kindNamed(name string) errdefs.Kind {
	for k := errdefs.Unknown; k <= errdefs.DeadlineExceededKind; k++ {
		if k.String() == name {
			return k
		}
	}
	return errdefs.Unknown
}
