// Package server is the one place that builds a control-plane node from its
// parts and runs it: `corral server` and `corral dev` call it, and tests start
// it in process.
//
//	New:  listen (HTTP, gRPC, hosts, gateway) ── TLS (or warn of plaintext)
//	      ── trace exporter (when configured) ── migrate (when given the owner URL) ── policy
//	      ── open store ── check schema ── Raft member (bootstrap, join or rejoin)
//	      ── host service (hosts join, stream, heartbeat) ── fleet (sessions'
//	         sandboxes) ── built-in tools over the fleet
//	      ── event hub (LISTEN) ── session runners + agent loop pool
//	      ── authn, authz, quotas, audit ── gRPC server + services
//	      ── gateway over loopback ── HTTP handler
//	Run:  resume loops with pending work ── keep runner assignments current
//	      ── the fleet's sweep of deleted sessions' placements (leader)
//	      ── serve both listeners until ctx ends ── stop runners ── Close
//	Close: end streams ── graceful stop ── stop loops and hub ── leave Raft
//	      ── close store
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/audit"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/envbuild"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/mcp"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/runners"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/controlplane/usage"
	"corral.dev/corral/internal/certreload"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/metrics"
	"corral.dev/corral/internal/tracing"
	"corral.dev/corral/internal/version"
	"corral.dev/corral/policy"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Server is a running control-plane node.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	// egress stores the hosts' egress audit records (egress.go).
	egress    *egressSink
	grpc      *grpc.Server
	http      *http.Server
	gwConn    *grpc.ClientConn
	httpLn    net.Listener
	grpcLn    net.Listener
	gwLn      net.Listener         // the gateway's way into the gRPC server
	certs     *certreload.Reloader // nil without TLS
	startedAt time.Time

	raft    *raftfsm.Node
	hostLn  net.Listener
	hosts   *hosts.Service
	fleet   *fleet.Fleet
	blobs   blob.Store // workspaces in transit, snapshots, files' content
	tools   *tools.Toolset
	exec    agentloop.ExecLimits // the bash tool's, from the runtime's profile
	runners *runners.Manager
	policy  *policy.Policy
	// classes resolves sandbox classes; mirrors are the operator's
	// package mirrors (--package-mirror), empty: packages are refused.
	classes   classes
	mirrors   envbuild.Mirrors
	sec       *api.Security
	hub       *events.Hub
	loops     *agentloop.Pool
	closing   chan struct{} // closed at shutdown: ends event streams
	stopHub   context.CancelFunc
	hubDone   chan struct{}
	closeOnce sync.Once

	metrics *nodeMetrics
	// meter is the usage meter, set once after Raft starts (whose
	// leadership observer reads it).
	meter     atomic.Pointer[usage.Meter]
	metricsLn *metrics.Listener // nil without MetricsAddr
	tracing   *tracing.Provider // nil without Tracing.Endpoint
}

// New builds a node: it takes its listeners, migrates (if configured), opens
// the store and wires the APIs. Nothing is served until Run.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, startedAt: time.Now(), metrics: newNodeMetrics()}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.httpLn, err = listen(cfg.HTTPListener, cfg.HTTPAddr, "http"); err != nil {
		return nil, err
	}
	if s.grpcLn, err = listen(cfg.GRPCListener, cfg.GRPCAddr, "grpc"); err != nil {
		return nil, err
	}
	if s.hostLn, err = listen(cfg.HostListener, cfg.HostAddr, "host service"); err != nil {
		return nil, err
	}
	if s.gwLn, err = listenGateway(); err != nil {
		return nil, err
	}
	if err := s.startTLS(); err != nil {
		return nil, err
	}
	if cfg.MetricsAddr != "" {
		var tc *tls.Config
		if s.certs != nil {
			tc = s.certs.ServerConfig()
		}
		if s.metricsLn, err = metrics.Listen(cfg.MetricsAddr, s.metrics.reg, tc, s.log); err != nil {
			return nil, err
		}
	}
	if err := s.startTracing(ctx); err != nil {
		return nil, err
	}
	if cfg.MigrationDatabaseURL != "" {
		if _, err := store.Migrate(ctx, cfg.MigrationDatabaseURL, s.log); err != nil {
			return nil, err
		}
	}
	if cfg.PolicyDir != "" {
		s.policy, err = policy.LoadDir(cfg.PolicyDir)
	} else {
		s.policy, err = policy.Load()
	}
	if err != nil {
		return nil, errdefs.InvalidArgument("%v", err)
	}
	s.store, err = store.Open(ctx, cfg.DatabaseURL, store.Options{
		Logger:                    s.log,
		DefaultConcurrentSessions: s.policy.DefaultQuota.ConcurrentSessions,
	})
	if err != nil {
		return nil, err
	}
	if err := s.checkSchema(ctx); err != nil {
		return nil, err
	}
	// Security before Raft: the node's membership changes go to the
	// audit log from its first request.
	if err := s.startSecurity(); err != nil {
		return nil, err
	}
	if err := s.startRaft(ctx); err != nil {
		return nil, err
	}
	if err := s.startFleet(ctx); err != nil {
		return nil, err
	}
	meter, err := usage.New(usage.Config{Cluster: usage.Raft{Node: s.raft}, Store: s.store.Usage(), Observe: s.metrics.observeSandbox, Logger: s.log})
	if err != nil {
		return nil, err
	}
	s.meter.Store(meter)
	s.metrics.watchMeter(meter.Flush)
	if err := s.startEvents(ctx); err != nil {
		return nil, err
	}
	s.grpc = api.NewGRPCServer(s.log, s.sec, s.metrics.grpcInterceptors()...)
	adminv1.RegisterClusterServiceServer(s.grpc, &api.ClusterService{
		NodeID:    cfg.NodeID,
		Version:   version.String(),
		StartedAt: s.startedAt,
		DB:        s.store,
		Raft:      s.raft,
	})
	adminv1.RegisterHostsServiceServer(s.grpc, &api.HostsService{Fleet: s.raft, Hosts: s.hosts, Ops: s.fleet, Tokens: s.hosts})
	adminv1.RegisterSandboxesServiceServer(s.grpc, &api.SandboxesService{Fleet: s.raft, Sandboxes: s.fleet})
	adminv1.RegisterOperatorKeysServiceServer(s.grpc, &api.OperatorKeysService{Store: s.store, Authn: s.sec.Authn})
	adminv1.RegisterTenantsServiceServer(s.grpc, &api.TenantsService{
		Store:        s.store,
		Policy:       s.policy,
		Authn:        s.sec.Authn,
		Quotas:       s.sec.Quotas,
		Sandboxes:    cmp.Or[quota.SandboxQuotaSetter](cfg.SandboxQuota, s.fleet),
		Reaper:       cmp.Or[api.SandboxReaper](cfg.SandboxReaper, s.fleet),
		StopSessions: s.loops.StopTenant,
		BuildKey:     s.environmentBuildKey,
		Blobs:        s.blobs,
		Logger:       s.log,
	})
	adminv1.RegisterUsageServiceServer(s.grpc, &api.UsageService{Usage: s.store.Usage(), Tenants: s.store.Tenants()})
	gw, conn, err := api.NewGateway(ctx, s.gwLn.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("building gateway: %w", err)
	}
	s.gwConn = conn
	s.http = s.newHTTPServer(api.NewHandler(api.HandlerOptions{
		Gateway:             gw,
		PublicAPI:           s.publicAPI(),
		PublicAPIBodyLimit:  publicapi.MaxBodyBytes,
		FileUploadBodyLimit: cfg.FileMaxBytes + publicapi.FileUploadOverhead,
		Authn:               s.sec.Authn,
		Ready:               s.store.Ping,
		Observe:             s.metrics.observeHTTP,
		Tracer:              s.tracing.Tracer(tracerName),
		Logger:              s.log,
	}))
	return s, nil
}

// startRaft starts this node's Raft member: it bootstraps, joins, or
// rejoins from the data directory.
func (s *Server) startRaft(ctx context.Context) error {
	c := s.cfg
	if !raftfsm.Initialized(c.DataDir) && !c.Bootstrap && c.Join == "" {
		return errdefs.FailedPrecondition("%s holds no Raft state: start the first node with --bootstrap and the others with --join ADDR (a member's --raft-http-addr)", c.DataDir)
	}
	ctx, cancel := context.WithTimeout(ctx, c.JoinTimeout)
	defer cancel()
	n, err := raftfsm.Start(ctx, raftfsm.Config{
		ID: c.NodeID, RaftAddr: c.RaftAddr, HTTPAddr: c.RaftHTTPAddr, DataDir: c.DataDir,
		Bootstrap: c.Bootstrap, Join: c.Join,
		NodeJoinToken: c.NodeJoinToken, SealKeyFile: c.SealKeyFile,
		HeartbeatTimeout: c.RaftHeartbeatTimeout, ElectionTimeout: c.RaftElectionTimeout,
		LeaderLeaseTimeout: c.RaftHeartbeatTimeout / 2, // zero: raft's default
		SnapshotThreshold:  c.RaftSnapshotThreshold, SnapshotInterval: c.RaftSnapshotInterval,
		// The policy's default quota binds every tenant without one of
		// its own (SetQuota) at placement: sandboxes, CPU and memory
		// requests, and the share of a host (which an override inherits).
		DefaultQuota: defaultSandboxQuota(s.policy.DefaultQuota),
		Audit:        s.auditMembership,
		ObserveApply: s.metrics.observeApply,
		LeaderChanged: func() {
			s.metrics.raftLeaderChanges.Inc()
			if m := s.meter.Load(); m != nil {
				m.LeaderChanged()
			}
		},
		Logger: s.log,
	})
	if err != nil && c.Join != "" && ctx.Err() != nil {
		return errdefs.Wrap(errdefs.UnavailableKind, err, "no cluster member let this node join within %v", c.JoinTimeout)
	}
	if err != nil {
		return err
	}
	s.raft = n
	s.metrics.watchLeader(n.IsLeader)
	return nil
}

// defaultSandboxQuota is the scheduler's form of the policy's default
// quota.
func defaultSandboxQuota(q policy.Quota) scheduler.Quota {
	return scheduler.Quota{
		ConcurrentSandboxes: q.ConcurrentSandboxes,
		CPUMillis:           int64(q.CPUMillis),
		MemoryMiB:           int64(q.MemoryMiB),
		HostSharePercent:    q.HostSharePercent,
	}
}

// auditMembership writes a node's trust and membership changes to the
// audit log, as fleet records (no tenant).
func (s *Server) auditMembership(ev raftfsm.AuditEvent) {
	resource := "cluster"
	if ev.Target != "" {
		resource = "cluster/members/" + ev.Target
	}
	s.sec.Audit.Record(store.AuditRecord{At: time.Now(), Principal: ev.Caller, Action: ev.Action, Resource: resource, Outcome: ev.Outcome})
}

// startSecurity builds authentication (API keys, OIDC issuers),
// authorization over the policy, quotas and the audit log.
func (s *Server) startSecurity() error {
	z, err := authz.New(s.policy)
	if err != nil {
		return err
	}
	authn, err := auth.New(auth.Config{
		Keys:    s.store.APIKeys(),
		Tenants: s.store.Tenants(),
		Users:   s.store.Principals(),
		Policy:  s.policy,
		Issuers: s.cfg.OIDCIssuers,
		Logger:  s.log,
	})
	if err != nil {
		return err
	}
	s.sec = &api.Security{
		Authn:  authn,
		Authz:  z,
		Quotas: quota.New(s.policy.DefaultQuota, s.store.Quotas(), nil),
		Audit:  audit.New(s.store.Audit(), 4096, s.log),
	}
	return nil
}

// startEvents starts the node's event hub (one LISTEN connection) and the
// pool that runs session loops.
func (s *Server) startEvents(ctx context.Context) error {
	s.hub = events.NewHub(s.store, s.log)
	// The loop's commits reach this node's streams as they are made;
	// other nodes' come by notification and are read back.
	s.store.ObserveAppends(s.hub.Appended)
	hubCtx, cancel := context.WithCancel(context.Background())
	s.stopHub, s.hubDone = cancel, make(chan struct{})
	ready := make(chan struct{})
	go func() { s.hub.Run(hubCtx, ready); close(s.hubDone) }()
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errdefs.Unavailable("the event listener did not start within 30s")
	}
	client, err := s.modelClient()
	if err != nil {
		return err
	}
	thinking, _ := s.cfg.thinking() // Validate checked it
	tracer := s.tracing.Tracer(tracerName)
	// Every model client, the operator's and each tenant's own, is
	// metered and (when tracing is on) traced alike.
	wrapModel := func(c model.Client) model.Client {
		c = meteredModel{next: c, m: s.metrics}
		if tracer != nil {
			c = tracedModel{next: c, provider: s.cfg.Model, tracer: tracer}
		}
		return c
	}
	var tools interface {
		agentloop.Toolbox
		agentloop.ToolCanceler
	} = meteredTools{next: s.tools, m: s.metrics}
	if tracer != nil {
		tools = tracedTools{next: tools, tracer: tracer}
	}
	// What the reads before each model request found that never changes.
	facts := newSessionFacts()
	loop := &agentloop.Loop{
		Store:  idleNotifier{Store: events.LoopStore{St: s.store}, fleet: s.fleet, log: s.log, newID: store.NewEventID},
		Model:  wrapModel(client),
		Models: s.tenantModels(wrapModel, facts),
		Limits: modelLimits{quotas: s.sec.Quotas, store: s.store, listCost: listCost(s.policy.ModelPrices), facts: facts},
		Tools:  tools,
		// MCP servers are called from here, with the static_bearer
		// credentials of the session's vaults.
		MCP: &mcp.Client{
			Credentials:          vaultCredentials{s.store.Vaults(s.raft.Keyring())},
			AllowPrivateNetworks: s.cfg.MCPAllowPrivateNetworks,
			Version:              version.String(),
			Log:                  s.log,
		},
		Previews:    events.Previews{St: s.store, Log: s.log},
		NewID:       store.NewEventID,
		Config:      agentloop.Config{MaxRounds: s.cfg.MaxRounds, MaxTokens: maxTokens, Exec: s.exec, Thinking: thinking},
		Log:         s.log,
		ObserveStep: s.metrics.observeStep,
		Tracer:      tracer,
		// The turn's sandbox is placed while its model thinks.
		PrepareSandbox: s.fleet.Prepare,
	}
	// A loop runs here only while Raft names this node its runner.
	s.runners = runners.New(runners.Config{
		Cluster:  s.raft,
		Claim:    s.store.Events().ClaimRunner,
		Pending:  s.store.SessionsNeedingRunner,
		Wake:     func(ctx context.Context, t tenant.ID, id string) { s.loops.WakeFrom(ctx, t, id) },
		Grace:    s.cfg.RunnerGrace,
		Interval: s.cfg.RunnerInterval,
		Logger:   s.log,
	})
	s.loops = agentloop.NewPool(loop, s.runners.Lock, s.log)
	s.closing = make(chan struct{})
	return nil
}

// admitInput is asked before a user.message is stored: the tenant's
// model token quota, then the fleet's admission of the turn's sandbox.
func (s *Server) admitInput(ctx context.Context, sessionID string) error {
	if err := (modelLimits{quotas: s.sec.Quotas, store: s.store}).checkTokens(ctx); err != nil {
		return err
	}
	return s.fleet.Admit(ctx, sessionID)
}

// sessionCreated readies a session created through this node for its
// first input, in the background, while some host has a warm sandbox: the
// fleet claims one for it if it is of its class, and this node takes its
// runner role, so that its first turn waits for neither. Without warm
// sandboxes it does nothing: the first turn waits for a cold sandbox
// anyway, beside which the runner's commit is noise, and taking the role
// at every create would add a commit to each (session create p99 x2 in a
// tight loop of creates).
func (s *Server) sessionCreated(ctx context.Context, sessionID string) {
	if !s.fleet.AnyWarm() {
		return
	}
	if t, ok := tenant.From(ctx); ok {
		s.runners.Prepare(t, sessionID)
	}
	s.fleet.PrepareWarm(ctx, sessionID)
}

// anthropicConfig is the operator's Anthropic client configuration.
func (s *Server) anthropicConfig() model.AnthropicConfig {
	return model.AnthropicConfig{
		BaseURL:      s.cfg.AnthropicBaseURL,
		APIKey:       s.cfg.AnthropicAPIKey,
		DefaultModel: s.cfg.AnthropicModel,
	}
}

// tenantModels is the loop's model picker: with the anthropic client,
// tenants' own model_api_key credentials; with the fake, none (nil).
func (s *Server) tenantModels(wrap func(model.Client) model.Client, facts *sessionFacts) agentloop.ModelPicker {
	if s.cfg.Model != "anthropic" {
		return nil
	}
	return &tenantModels{vaults: s.store.Vaults(s.raft.Keyring()), base: s.anthropicConfig(), allowPrivate: s.cfg.MCPAllowPrivateNetworks, wrap: wrap, facts: facts}
}

// modelClient builds the model client Config.Model names.
func (s *Server) modelClient() (model.Client, error) {
	if s.cfg.Model != "anthropic" {
		return model.Fake{}, nil
	}
	c, err := model.NewAnthropic(s.anthropicConfig())
	if err != nil {
		return nil, errdefs.InvalidArgument("%v", err)
	}
	s.log.Info("model client", "model", "anthropic", "base_url", s.cfg.AnthropicBaseURL)
	return c, nil
}

// publicAPI builds the /v1/ handler: the Managed Agents REST API.
func (s *Server) publicAPI() http.Handler {
	v1 := http.NewServeMux()
	guard := &publicapi.Guard{Authz: s.sec.Authz, Audit: s.sec.Audit}
	ev := &publicapi.EventsHandler{
		Store:       s.store,
		Hub:         s.hub,
		Wake:        s.runners.WakeForInput,
		WriteError:  api.WriteError,
		Closing:     s.closing,
		Guard:       guard,
		Admit:       s.admitInput,
		OpenStreams: s.metrics.sseStreams,
	}
	ev.Register(v1)
	publicapi.New(publicapi.Options{Store: s.store, Events: ev, Guard: guard, SessionDeleted: s.sessionDeleted, SessionArchived: s.fleet.SessionArchived, SessionCreated: s.sessionCreated, AdmitSession: s.admitSession, CheckSandboxClass: s.fleet.CheckClass, Keyring: s.raft.Keyring(),
		PackageMirrors: s.mirrors, RequestBuild: s.buildsFn(),
		Blobs: s.blobs, FileMaxBytes: s.cfg.FileMaxBytes, FileQuota: s.fileQuota, WorkLeaseTTL: s.cfg.WorkLeaseTTL, Logger: s.log,
		ListCost:         listCost(s.policy.ModelPrices),
		ModelCredentials: publicapi.ModelCredentialPolicy{Allowed: s.cfg.Model == "anthropic", AllowLoopback: s.cfg.MCPAllowPrivateNetworks},
		UnrestrictedNetworking: func(ctx context.Context) bool {
			id, ok := tenant.From(ctx)
			return ok && s.policy.GrantsUnrestrictedNetworking(string(id))
		}}).Register(v1)
	return s.sec.Authenticate(api.RecordRoute(v1))
}

// fileQuota is the file storage limit, in bytes, of the tenant in ctx.
func (s *Server) fileQuota(ctx context.Context) (int64, error) {
	id, err := tenant.Required(ctx)
	if err != nil {
		return 0, err
	}
	q, err := s.sec.Quotas.Effective(ctx, id)
	if err != nil {
		return 0, err
	}
	return q.FileStorageBytes(), nil
}

func listen(ln net.Listener, addr, what string) (net.Listener, error) {
	if ln != nil {
		return ln, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w", what, err)
	}
	return ln, nil
}

func (s *Server) checkSchema(ctx context.Context) error {
	cur, latest, err := s.store.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if cur < latest {
		return errdefs.FailedPrecondition("database schema is at version %d and this binary needs %d: run `corral migrate` with the owner role's URL, or start with --migration-database-url", cur, latest)
	}
	if cur > latest {
		return errdefs.FailedPrecondition("database schema is at version %d, newer than this binary knows (%d): upgrade corral", cur, latest)
	}
	return nil
}

// HTTPAddr is the address the HTTP listener is bound to.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// GRPCAddr is the address the gRPC listener is bound to.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// MetricsURL is the URL of the node's /metrics, or "" without
// Config.MetricsAddr.
func (s *Server) MetricsURL() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.URL()
}

// HostAddr is the address the host service listens on.
func (s *Server) HostAddr() string { return s.hostLn.Addr().String() }

// Hosts returns the node's host service (corral dev issues its host's join
// token through it; tests watch hosts with it).
func (s *Server) Hosts() *hosts.Service { return s.hosts }

// Raft returns the node's Raft member.
func (s *Server) Raft() *raftfsm.Node { return s.raft }

// GRPCMethods lists the full names of every method the node's gRPC server
// serves (for tests that walk them all).
func (s *Server) GRPCMethods() []string {
	var out []string
	for svc, info := range s.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			out = append(out, "/"+svc+"/"+m.Name)
		}
	}
	sort.Strings(out)
	return out
}

// ActiveLoops is how many session loops run on this node now.
func (s *Server) ActiveLoops() int { return s.loops.Active() }

// Store returns the node's store, for wiring that runs beside the server
// (corral dev issues its key through it).
func (s *Server) Store() *store.Store { return s.store }

// Run serves until ctx is done or a listener fails, then shuts down
// gracefully. It returns nil after a requested shutdown.
func (s *Server) Run(ctx context.Context) error {
	// Loops that a stop interrupted resume from their logs.
	if err := events.Resume(ctx, s.store, s.loops.Wake); err != nil {
		s.log.Warn("resuming session loops", "err", err)
	}
	rctx, stopRunners := context.WithCancel(context.Background())
	runnersDone := make(chan struct{})
	go func() { s.runners.Run(rctx); close(runnersDone) }()
	sweepDone := make(chan struct{})
	go func() { s.fleet.Run(rctx); close(sweepDone) }()
	drainsDone := make(chan struct{})
	go func() { s.fleet.RunDrains(rctx); close(drainsDone) }()
	certsDone := make(chan struct{})
	go func() { s.runCerts(rctx); close(certsDone) }()
	meterDone := make(chan struct{})
	go func() { s.meter.Load().Run(rctx); close(meterDone) }()
	egressDone := make(chan struct{})
	go func() { s.egress.run(rctx); close(egressDone) }()
	orphansDone := make(chan struct{})
	go func() { s.orphans().run(rctx); close(orphansDone) }()
	buildsDone := make(chan struct{})
	go func() { s.fleet.RunBuilds(rctx); close(buildsDone) }()
	errc := make(chan error, 4)
	if s.metricsLn != nil {
		go func() {
			if err := s.metricsLn.Serve(); err != nil {
				errc <- err
			}
		}()
	}
	go func() { errc <- s.grpc.Serve(s.grpcLn) }()
	go func() { errc <- s.grpc.Serve(s.gwLn) }()
	go func() { errc <- s.serveHTTP() }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("serving: %w", err)
	}
	stopRunners()
	<-runnersDone
	<-sweepDone
	<-drainsDone
	<-certsDone
	<-meterDone
	<-egressDone
	<-orphansDone
	<-buildsDone
	s.Close()
	return err
}

// sessionDeleted lets go of a deleted session's sandbox (the fleet's sweep
// repairs a release that fails here).
func (s *Server) sessionDeleted(ctx context.Context, sessionID string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s.fleet.SessionDeleted(ctx, sessionID)
}

// Close stops the node: it ends event streams, drains the listeners
// gracefully (within ShutdownTimeout), stops the loops, leaves Raft and
// closes the store. Run calls it when it returns; a node built with New
// and never run must be closed with it. It is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		defer cancel()
		// Streams never go idle by themselves: end them so Shutdown can
		// drain.
		close(s.closing)
		if err := s.http.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			s.log.Warn("http shutdown", "err", err)
		}
		stopped := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			s.grpc.Stop()
		}
		s.close()
	})
}

// close releases what New acquired; safe on a partly built server.
func (s *Server) close() {
	if s.loops != nil {
		s.loops.Stop()
	}
	if s.stopHub != nil {
		s.stopHub()
		<-s.hubDone
	}
	if s.gwConn != nil {
		s.gwConn.Close()
	}
	if s.hosts != nil {
		s.hosts.Close()
	}
	if s.fleet != nil {
		s.fleet.Close()
	}
	// Raft before the audit log: its forwarding endpoint records
	// membership changes until it stops.
	if s.raft != nil {
		if err := s.raft.Shutdown(); err != nil {
			s.log.Warn("raft shutdown", "err", err)
		}
	}
	if s.sec != nil && s.sec.Audit != nil {
		s.sec.Audit.Close()
	}
	if s.store != nil {
		s.store.Close()
	}
	if s.tracing != nil {
		// After the loops: their last spans go out.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.tracing.Shutdown(ctx); err != nil {
			s.log.Warn("stopping the trace exporter", "err", err)
		}
		cancel()
	}
	if s.metricsLn != nil {
		// Last: a scrape sees the node until it is gone.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.metricsLn.Close(ctx)
		cancel()
	}
	for _, ln := range []net.Listener{s.httpLn, s.grpcLn, s.gwLn, s.hostLn} {
		if ln != nil {
			ln.Close()
		}
	}
}
