package raftfsm

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errhttp"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
)

// Config is one control-plane node's Raft configuration.
type Config struct {
	ID       string // unique, stable across restarts
	RaftAddr string // host:port the Raft TCP transport binds and advertises; a concrete host
	HTTPAddr string // host:port of the forwarding endpoint; port 0 picks one
	DataDir  string // raft.db (logs and stable store), snapshots/, node/ (its TLS identity), seal.key when generated

	// Bootstrap makes this node a one-voter cluster on first start. Join is
	// the HTTP address of any member, asked to add this node as a voter on
	// first start. With existing state in DataDir both are ignored.
	Bootstrap bool
	Join      string

	// Nodes speak mutual TLS to each other (Raft and the forwarding
	// endpoint) with node certificates from the cluster's nodes' CA, kept
	// in DataDir/node. A bootstrap node makes the CA and its certificate; a
	// joining node's first start trades NodeJoinToken (one-time, from
	// IssueNodeToken; `corral admin node-token`) for its certificate; later
	// starts need no token.
	NodeJoinToken logging.Secret

	// SealKeyFile is the seal keyring (internal/seal) every node of the
	// cluster shares: secrets in Raft and this node's key are sealed with
	// it. Empty: DataDir/seal.key, generated (and logged) on a bootstrap
	// node's first start. Seal, when set, is used instead (in-process
	// callers).
	SealKeyFile string
	Seal        *seal.Keyring

	// Audit, when set, receives every trust and membership change made
	// through this node (joins, removals, certificates, node tokens, seal
	// rotations), besides its log line. It must not block.
	Audit func(AuditEvent)

	// ObserveApply, when set, receives every command applied through this
	// node once it is settled: its type, how long it took as the caller
	// saw it (forwarding to the leader and retries included) and its
	// error (nil when committed, the command's own refusal included).
	// LeaderChanged, when set, is called when this node sees a new
	// leader, or none. Both must not block (metrics).
	ObserveApply  func(cmd CommandType, d time.Duration, err error)
	LeaderChanged func()

	DefaultQuota  scheduler.Quota  // tenants without their own quota
	Scheduler     scheduler.Config // placement weights
	MaxRecentKeys int              // idempotency table bound; 0: DefaultRecentKeys

	// Raft timing; zero takes raft.DefaultConfig's.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64        // log entries between snapshots
	SnapshotInterval   time.Duration // how often the threshold is checked
	TrailingLogs       uint64        // log entries kept after a snapshot
	ApplyTimeout       time.Duration // one raft.Apply; default 10s

	// PlaceBatch is how many place commands the leader commits in one
	// log entry at most (place_batch); 0: DefaultPlaceBatch, 1: none
	// batched, each its own entry as it comes.
	PlaceBatch int

	// Now is the clock for join tokens' expiry; default time.Now.
	Now func() time.Time

	Logger        *slog.Logger // default discards
	RaftLogOutput io.Writer    // hashicorp/raft's own log; default discards
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return errdefs.InvalidArgument("raft node needs an id")
	case hostpki.ValidateNodeID(c.ID) != nil:
		return hostpki.ValidateNodeID(c.ID)
	case c.RaftAddr == "":
		return errdefs.InvalidArgument("raft node %s needs a raft address", c.ID)
	case c.DataDir == "":
		return errdefs.InvalidArgument("raft node %s needs a data directory", c.ID)
	case c.Bootstrap && c.Join != "":
		return errdefs.InvalidArgument("raft node %s: bootstrap and join are exclusive", c.ID)
	}
	return nil
}

// Node is one member of the control plane's Raft cluster.
type Node struct {
	cfg    Config
	log    *slog.Logger
	fsm    *FSM
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	store  *raftboltdb.BoltStore
	srv    *http.Server
	ln     net.Listener
	client *http.Client
	ring   *seal.Keyring
	creds  *creds

	// failMu guards failing: while this node leads, the peers whose
	// heartbeats fail, and since when (raft observations).
	failMu  sync.Mutex
	failing map[string]time.Time

	// batch groups the place commands this node commits as leader.
	batch *placeBatcher

	stop     context.CancelFunc
	bg       sync.WaitGroup
	shutOnce sync.Once
	shutErr  error
}

// Start opens the node's storage, starts Raft and the forwarding endpoint,
// and bootstraps or joins as configured. A node restarted from its data
// directory rejoins its cluster from the stored configuration. A first start
// that fails removes the state it created.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ApplyTimeout == 0 {
		cfg.ApplyTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	if cfg.RaftLogOutput == nil {
		cfg.RaftLogOutput = io.Discard
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating raft data dir: %w", err)
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node_id", cfg.ID), fsm: NewFSM(cfg.DefaultQuota, cfg.MaxRecentKeys)}
	fresh := !Initialized(cfg.DataDir)
	if n.ring, err = loadRing(&cfg, n.log); err != nil {
		return nil, err
	}
	if n.creds, err = n.loadOrMakeCreds(ctx, fresh); err != nil {
		return nil, err
	}
	n.client = &http.Client{
		Timeout:   cfg.ApplyTimeout + 5*time.Second,
		Transport: &http.Transport{TLSClientConfig: hostpki.NodeClientTLS(n.creds.ca, n.creds.cert), MaxIdleConnsPerHost: 4},
	}
	defer func() {
		if err != nil {
			n.Shutdown()
			if fresh {
				// A failed first start (a join refused, say) leaves no
				// state behind that would make the next start skip it.
				_ = os.Remove(filepath.Join(cfg.DataDir, "raft.db"))
				_ = os.RemoveAll(filepath.Join(cfg.DataDir, "snapshots"))
			}
		}
	}()

	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft." + cfg.ID, Output: cfg.RaftLogOutput, Level: hclog.Info})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hlog
	// Concurrent applies reach the log in batches, and followers receive
	// bigger appends: fewer disk syncs per placement under load.
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	if cfg.HeartbeatTimeout > 0 {
		rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	}
	if cfg.ElectionTimeout > 0 {
		rc.ElectionTimeout = cfg.ElectionTimeout
	}
	if cfg.LeaderLeaseTimeout > 0 {
		rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	}
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.SnapshotInterval > 0 {
		rc.SnapshotInterval = cfg.SnapshotInterval
	}
	if cfg.TrailingLogs > 0 {
		rc.TrailingLogs = cfg.TrailingLogs
	}

	n.store, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("opening raft store: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog)
	if err != nil {
		return nil, fmt.Errorf("opening snapshot store: %w", err)
	}
	// No separate advertise address: the bound one (a concrete host, port 0
	// allowed) is what peers dial, over mutual TLS.
	stream, err := newStreamLayer(cfg.RaftAddr, n.creds)
	if err != nil {
		return nil, fmt.Errorf("starting raft transport: %w", err)
	}
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 4, Timeout: cfg.ApplyTimeout, Logger: hlog,
	})
	existing, err := raft.HasExistingState(n.store, n.store, snaps)
	if err != nil {
		return nil, fmt.Errorf("reading raft state: %w", err)
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, n.store, n.store, snaps, n.trans)
	if err != nil {
		return nil, fmt.Errorf("starting raft: %w", err)
	}

	obs := make(chan raft.Observation, 64)
	n.raft.RegisterObserver(raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.LeaderObservation:
			return true
		}
		return false
	}))

	httpAddr := cfg.HTTPAddr
	if httpAddr == "" {
		httpAddr = "127.0.0.1:0"
	}
	tcp, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return nil, fmt.Errorf("listening for forwarded writes: %w", err)
	}
	n.ln = tls.NewListener(tcp, forwardingTLS(n.creds))
	n.srv = &http.Server{Handler: n.handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: cfg.ApplyTimeout + 5*time.Second,
		ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelDebug)}
	bgctx, stop := context.WithCancel(context.Background())
	n.stop = stop
	if cfg.PlaceBatch != 1 {
		n.batch = newPlaceBatcher(cfg.PlaceBatch, n.applyLocal, bgctx.Done())
		// Not in n.bg: a worker whose entry raft took but never answered
		// (it stopped with the entry still queued) would hold Shutdown;
		// its callers are answered when bgctx ends.
		for range placeBatchers {
			go n.batch.run()
		}
	}
	n.bg.Go(func() { _ = n.srv.Serve(n.ln) })
	n.bg.Go(func() { n.watchPeers(bgctx, obs) })

	switch {
	case existing:
		// Our HTTP address may have changed: announce it once a leader exists.
		n.bg.Go(func() { n.announce(bgctx); n.commitNodeCA(bgctx) })
	case cfg.Bootstrap:
		err := n.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: rc.LocalID, Address: n.trans.LocalAddr(),
		}}}).Error()
		if err != nil {
			return nil, fmt.Errorf("bootstrapping raft: %w", err)
		}
		if err := n.commitNodeCA(ctx); err != nil {
			return nil, err
		}
		n.bg.Go(func() { n.announce(bgctx) })
	case cfg.Join != "":
		body, _ := json.Marshal(joinRequest{ID: cfg.ID, RaftAddr: string(n.trans.LocalAddr()), HTTPAddr: n.HTTPAddr()})
		if err := n.forward(ctx, cfg.Join, "/v1/raft/join", body, nil); err != nil {
			return nil, fmt.Errorf("joining through %s: %w", cfg.Join, err)
		}
	}
	n.log.Info("raft node started", "raft_addr", n.trans.LocalAddr(), "http_addr", n.HTTPAddr(), "existing_state", existing,
		"node_ca_pin", hostpki.Pin(n.creds.ca.Raw), "seal_key_id", n.ring.CurrentID())
	return n, nil
}

// announce records this node's HTTP address in the replicated state.
func (n *Node) announce(ctx context.Context) {
	_, err := Apply(ctx, n, Member, "member/"+n.cfg.ID+"/"+n.HTTPAddr(), MemberPayload{ID: n.cfg.ID, HTTPAddr: n.HTTPAddr()})
	if err != nil && ctx.Err() == nil {
		n.log.Warn("announcing http address", "err", err)
	}
}

// Shutdown stops the node. Its data directory keeps its state for a restart.
func (n *Node) Shutdown() error {
	n.shutOnce.Do(func() {
		if n.stop != nil {
			n.stop()
		}
		var errs []error
		if n.srv != nil {
			errs = append(errs, n.srv.Close())
		}
		if n.raft != nil {
			errs = append(errs, n.raft.Shutdown().Error())
		}
		if n.trans != nil {
			errs = append(errs, n.trans.Close())
		}
		n.bg.Wait()
		if n.client != nil {
			n.client.CloseIdleConnections()
		}
		if n.store != nil {
			errs = append(errs, n.store.Close())
		}
		n.shutErr = errors.Join(errs...)
	})
	return n.shutErr
}

// ID is the node's id.
func (n *Node) ID() string { return n.cfg.ID }

// RaftAddr is the address the Raft transport listens on.
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// HTTPAddr is the forwarding endpoint's address.
func (n *Node) HTTPAddr() string { return n.ln.Addr().String() }

// IsLeader reports whether this node currently believes it leads.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Term is this node's current Raft term: a leader's is its own, which no
// other leader shares (the usage meter's fence).
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// Leader returns the id of the leader this node knows of, or "".
func (n *Node) Leader() string { _, id := n.raft.LeaderWithID(); return string(id) }

// AppliedIndex is the index of the last log this node's FSM has applied:
// a Read after AppliedIndex() >= i sees the write committed at i. (Raft's
// own AppliedIndex runs ahead of the FSM; see FSM.applied.)
func (n *Node) AppliedIndex() uint64 { return n.fsm.Applied() }

// WaitApplied returns once this node's FSM has applied the log at index, so
// that a Read from here on sees that write (read your writes on a follower),
// or with an Unavailable error when ctx ends first. The FSM wakes it.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	for {
		changed := n.fsm.Changed()
		if n.AppliedIndex() >= index {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.UnavailableKind, ctx.Err(), "waiting for node %s to apply index %d", n.cfg.ID, index)
		}
	}
}

// Wait returns once cond holds over this node's state, or with ctx's error
// (its kind kept) when ctx ends first. cond runs under the FSM's read lock
// after every change this node applies: it must be quick and keep nothing
// the view returns.
func (n *Node) Wait(ctx context.Context, cond func(v View) bool) error {
	for {
		changed := n.fsm.Changed()
		var ok bool
		n.fsm.Read(func(v View) { ok = cond(v) })
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.KindOf(ctx.Err()), ctx.Err(), "waiting on node %s's state", n.cfg.ID)
		}
	}
}

// Changed returns a channel closed at this node's next state change (for
// waiters on more than the state: take it before reading the state).
func (n *Node) Changed() <-chan struct{} { return n.fsm.Changed() }

// leaderHTTP is the leader's forwarding address, or "" when unknown.
func (n *Node) leaderHTTP() string {
	id := n.Leader()
	if id == "" {
		return ""
	}
	var addr string
	n.fsm.Read(func(v View) { addr = v.Member(id) })
	return addr
}

var _ Applier = (*Node)(nil)

// applyCommand commits c through Raft from any node: on a follower the
// write is forwarded to the leader. While there is no leader, or the leader
// changes under it, it retries with the same idempotency key until ctx
// ends. The command's own failure is in the Result (see Result.Error).
// Callers use Apply.
func (n *Node) applyCommand(ctx context.Context, c Command) (res Result, err error) {
	if n.cfg.ObserveApply != nil {
		start := time.Now()
		defer func() { n.cfg.ObserveApply(c.Type, time.Since(start), err) }()
	}
	body, err := json.Marshal(c)
	if err != nil {
		return Result{}, fmt.Errorf("encoding command: %w", err)
	}
	for {
		var r Result
		err := errdefs.Unavailable("no leader known")
		if n.raft.State() == raft.Shutdown {
			return Result{}, errdefs.Wrap(errdefs.CanceledKind, raft.ErrRaftShutdown, "applying %s", c.Type)
		}
		if n.IsLeader() {
			r, err = n.applyLeader(ctx, c, body)
		} else if addr := n.leaderHTTP(); addr != "" {
			err = n.post(ctx, addr, "/v1/raft/apply", body, &r)
		}
		if err == nil {
			return r, nil
		}
		if !retryable(err) {
			return Result{}, err
		}
		if werr := pause(ctx); werr != nil {
			return Result{}, errdefs.Wrap(errdefs.UnavailableKind, err, "applying %s: %v", c.Type, werr)
		}
	}
}

// applyLeader applies c, encoded as body, on this node, which must lead:
// a place command goes in the next batch.
func (n *Node) applyLeader(ctx context.Context, c Command, body []byte) (Result, error) {
	if c.Type == CmdPlace && n.batch != nil {
		return n.batch.apply(ctx, c)
	}
	return n.applyLocal(body)
}

// applyLocal applies an encoded command on this node, which must lead.
func (n *Node) applyLocal(body []byte) (Result, error) {
	f := n.raft.Apply(body, n.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return Result{}, raftErr(err)
	}
	r, ok := f.Response().(*Result)
	if !ok {
		return Result{}, fmt.Errorf("fsm returned %T", f.Response())
	}
	out := *r
	out.Index = f.Index()
	return out, nil
}

// raftErr gives raft's leadership errors the Unavailable kind.
func raftErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout),
		errors.Is(err, raft.ErrAbortedByRestore):
		return errdefs.Wrap(errdefs.UnavailableKind, err, "raft")
	case errors.Is(err, raft.ErrRaftShutdown):
		return errdefs.Wrap(errdefs.CanceledKind, err, "raft")
	}
	return err
}

func retryable(err error) bool { return errdefs.KindOf(err) == errdefs.UnavailableKind }

// pause waits a retry interval or until ctx ends.
func pause(ctx context.Context) error { return pauseFor(ctx, 20*time.Millisecond) }

func pauseFor(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Read runs fn against this node's local state, which may lag the leader by
// the replication delay (stale read; any node, no network).
func (n *Node) Read(fn func(v View)) { n.fsm.Read(fn) }

// ReadConsistent runs fn linearizably: on the leader, after a Barrier has
// committed through a quorum and the FSM has applied everything before it.
// On a follower it returns errdefs.Unavailable naming the leader.
func (n *Node) ReadConsistent(ctx context.Context, fn func(v View)) error {
	if !n.IsLeader() {
		return errdefs.Unavailable("node %s is not the leader (leader: %q)", n.cfg.ID, n.Leader())
	}
	timeout := n.cfg.ApplyTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
		if timeout <= 0 {
			return errdefs.Wrap(errdefs.DeadlineExceededKind, context.DeadlineExceeded, "linearizable read")
		}
	}
	if err := n.raft.Barrier(timeout).Error(); err != nil {
		return raftErr(err)
	}
	n.fsm.Read(fn)
	return nil
}

// AddVoter adds a node to the cluster (through the leader) and records its
// HTTP address. Adding a node already present at the same address is a no-op.
func (n *Node) AddVoter(ctx context.Context, id, raftAddr, httpAddr string) error {
	body, _ := json.Marshal(joinRequest{ID: id, RaftAddr: raftAddr, HTTPAddr: httpAddr})
	return n.toLeader(ctx, "/v1/raft/join", body)
}

// RemoveServer removes a node from the cluster, through the leader. Removing
// the last voter is refused with errdefs.FailedPrecondition.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	body, _ := json.Marshal(joinRequest{ID: id})
	return n.toLeader(ctx, "/v1/raft/remove", body)
}

// Snapshot takes a snapshot now and compacts the log behind it.
func (n *Node) Snapshot() error { return raftErr(n.raft.Snapshot().Error()) }

// Members returns the cluster configuration as this node knows it.
func (n *Node) Members() ([]raft.Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, raftErr(err)
	}
	return f.Configuration().Servers, nil
}

// toLeader runs a membership call on the leader: locally when this node
// leads, else over HTTP.
func (n *Node) toLeader(ctx context.Context, path string, body []byte) error {
	if n.IsLeader() {
		var req joinRequest
		_ = json.Unmarshal(body, &req)
		if err := n.membership(ctx, path, req); !retryable(err) {
			return err
		}
	}
	for {
		addr := n.leaderHTTP()
		if addr != "" {
			if err := n.forward(ctx, addr, path, body, nil); !retryable(err) {
				return err
			}
		}
		if err := pause(ctx); err != nil {
			return errdefs.Unavailable("%s: no leader reachable: %v", path, err)
		}
	}
}

// membership applies a join or remove on the leader, and audits it.
func (n *Node) membership(ctx context.Context, path string, req joinRequest) (err error) {
	defer func() {
		action := "node.join"
		if path == "/v1/raft/remove" {
			action = "node.remove"
		}
		n.audit(n.callerOf(ctx), action, err, "member_id", req.ID, "raft_addr", req.RaftAddr, "http_addr", req.HTTPAddr)
	}()
	if req.ID == "" {
		return errdefs.InvalidArgument("membership change needs a node id")
	}
	servers, err := n.Members()
	if err != nil {
		return err
	}
	switch path {
	case "/v1/raft/join":
		if req.RaftAddr == "" {
			return errdefs.InvalidArgument("joining node %s needs a raft address", req.ID)
		}
		if err := n.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr), 0, n.cfg.ApplyTimeout).Error(); err != nil {
			return raftErr(err)
		}
		_, err := Apply(ctx, n, Member, "member/"+req.ID+"/"+req.HTTPAddr, MemberPayload{ID: req.ID, HTTPAddr: req.HTTPAddr})
		return err
	case "/v1/raft/remove":
		found, voters := false, 0
		for _, s := range servers {
			if s.Suffrage == raft.Voter {
				voters++
			}
			if string(s.ID) == req.ID {
				found = true
			}
		}
		if !found {
			return errdefs.NotFound("cluster member %s", req.ID)
		}
		if voters <= 1 {
			return errdefs.FailedPrecondition("refusing to remove %s: it is the cluster's last voter", req.ID)
		}
		// Forget the address first: after removing itself the leader can no
		// longer commit.
		if _, err := Apply(ctx, n, Member, "", MemberPayload{ID: req.ID}); err != nil {
			return err
		}
		return raftErr(n.raft.RemoveServer(raft.ServerID(req.ID), 0, n.cfg.ApplyTimeout).Error())
	}
	return errdefs.NotFound("membership call %s", path)
}

type joinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr,omitempty"`
	HTTPAddr string `json:"http_addr,omitempty"`
}

// wireError is a forwarding endpoint's error body.
type wireError struct {
	Kind   errdefs.Kind `json:"kind"`
	Msg    string       `json:"msg"`
	Leader string       `json:"leader,omitempty"` // the leader's HTTP address, when known
}

// handler serves the forwarding endpoint. Its TLS handshake admitted a
// node certificate from the nodes' CA, or a joining node asking for the
// join server name, which reaches only the token exchange (nodeJoinHandler).
// Writes act only when this node leads; otherwise it answers 503 with the
// leader's address and the caller retries.
func (n *Node) handler() http.Handler {
	nodes, join := n.nodeHandler(), n.nodeJoinHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.TLS == nil:
			n.writeErr(w, errNoNodeCert)
		case r.TLS.ServerName == hostpki.NodeJoinServerName:
			join.ServeHTTP(w, r)
		case len(r.TLS.VerifiedChains) == 0:
			n.writeErr(w, errNoNodeCert) // the handshake refuses these; kept as a second lock
		default:
			id, err := hostpki.NodeID(r.TLS.VerifiedChains[0][0])
			if err != nil {
				n.writeErr(w, err)
				return
			}
			nodes.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, id)))
		}
	})
}

// nodeHandler serves authenticated nodes (and operators' commands run with
// a node's certificate).
func (n *Node) nodeHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/raft/apply", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			n.writeErr(w, errdefs.InvalidArgument("reading command: %v", err))
			return
		}
		if !n.IsLeader() {
			n.writeErr(w, errdefs.Unavailable("node %s is not the leader", n.cfg.ID))
			return
		}
		var c Command
		if err := json.Unmarshal(body, &c); err != nil {
			n.writeErr(w, errdefs.InvalidArgument("decoding command: %v", err))
			return
		}
		var res Result
		if batchable(c) && n.batch != nil {
			res, err = n.batch.apply(r.Context(), c)
		} else {
			res, err = n.applyLocal(body)
		}
		if err != nil {
			n.writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
	member := func(w http.ResponseWriter, r *http.Request) {
		var req joinRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			n.writeErr(w, errdefs.InvalidArgument("decoding membership request: %v", err))
			return
		}
		if !n.IsLeader() {
			n.writeErr(w, errdefs.Unavailable("node %s is not the leader", n.cfg.ID))
			return
		}
		if err := n.membership(r.Context(), r.URL.Path, req); err != nil {
			n.writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
	mux.HandleFunc("POST /v1/raft/join", member)
	mux.HandleFunc("POST /v1/raft/remove", member)
	n.operatorRoutes(mux)
	return mux
}

func (n *Node) writeErr(w http.ResponseWriter, err error) {
	we := wireError{Kind: errdefs.KindOf(err), Msg: err.Error()}
	if we.Kind == errdefs.UnavailableKind {
		we.Leader = n.leaderHTTP()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errhttp.Status(err))
	_ = json.NewEncoder(w).Encode(we)
}

// post sends body to addr's path and decodes a 2xx reply into out. Network
// failures and 503s are errdefs.Unavailable (retryable); a *leaderHint error
// carries the leader's address when the peer knew it.
func (n *Node) post(ctx context.Context, addr, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return errdefs.InvalidArgument("forwarding to %s: %v", addr, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.Wrap(errdefs.UnavailableKind, err, "forwarding to %s", addr)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		if out == nil || resp.StatusCode == http.StatusNoContent {
			return nil
		}
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return errdefs.Wrap(errdefs.UnavailableKind, err, "decoding reply from %s", addr)
		}
		return nil
	}
	var we wireError
	if err := json.NewDecoder(resp.Body).Decode(&we); err != nil {
		return errdefs.Unavailable("forwarding to %s: status %d", addr, resp.StatusCode)
	}
	return &leaderHint{err: &errdefs.Error{Kind: we.Kind, Msg: we.Msg}, leader: we.Leader}
}

type leaderHint struct {
	err    error
	leader string
}

func (e *leaderHint) Error() string { return e.err.Error() }
func (e *leaderHint) Unwrap() error { return e.err }

// forward posts to addr, following leader hints and retrying while the
// cluster has no leader, until ctx ends.
func (n *Node) forward(ctx context.Context, addr, path string, body []byte, out any) error {
	for {
		err := n.post(ctx, addr, path, body, out)
		if !retryable(err) {
			return err
		}
		if h := (*leaderHint)(nil); errors.As(err, &h) && h.leader != "" && h.leader != addr {
			addr = h.leader
			continue
		}
		if werr := pause(ctx); werr != nil {
			return errdefs.Wrap(errdefs.UnavailableKind, err, "forwarding %s: %v", path, werr)
		}
	}
}
