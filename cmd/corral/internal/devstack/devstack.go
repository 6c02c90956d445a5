// Package devstack runs all of corral on one machine for development: a
// private PostgreSQL under the data directory (unless a database URL is given),
// a one-node control plane and a host agent in the same process, joined with
// a token the stack issues itself. It is what `corral dev` runs.
//
// It lives under cmd/corral, beside the main that runs it, because it wires
// both daemons: the dependency rules forbid controlplane/ and hostagent/ from
// importing each other, and internal/ sits below both.
//
//	Run: lock data dir ── listen ── start postgres ── migrate ── server
//	     (a one-node Raft cluster bootstrapped in <data dir>/raft)
//	     ── issue dev key (first start) ── write dev.env
//	     ── host agent (gvisor when root with scripts/runtime installed, else
//	        process, loudly) ── serve until ctx ends
//	     ── stop host agent and server ── stop postgres
package devstack

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/pglocal"
	"corral.dev/corral/internal/tracing"
)

// Options configure a dev stack.
type Options struct {
	// DataDir holds the PostgreSQL cluster, dev.env and the lock. Default ./.corral.
	DataDir string
	// DatabaseURL, when set, is used instead of a private cluster; it must
	// connect as the application role.
	DatabaseURL string
	// MigrationDatabaseURL is the owner role's URL, with DatabaseURL.
	MigrationDatabaseURL string
	HTTPAddr             string
	GRPCAddr             string
	NodeID               string
	// InsecureListen is as in server.Config: plaintext beyond loopback.
	InsecureListen bool
	// MetricsAddr and HostMetricsAddr serve the control plane's and the
	// dev host's Prometheus metrics (empty: off); their URLs go to dev.env
	// as CORRAL_METRICS_URL and CORRAL_HOST_METRICS_URL.
	MetricsAddr, HostMetricsAddr string
	// Tracing exports both daemons' traces (empty Endpoint: off).
	Tracing tracing.Config
	// HostAddr is the host service's listen address, for hosts beyond the
	// dev stack's own (default 127.0.0.1:0: any free port, logged).
	HostAddr string
	// Runtime is the dev host's sandbox runtime: gvisor, runc or process;
	// default gvisor when running as root with scripts/runtime installed,
	// else process (which isolates nothing, and says so).
	Runtime string
	// UnsafeAllowProcessRuntimeWithRealModel is as in server.Config.
	UnsafeAllowProcessRuntimeWithRealModel bool
	// Model, AnthropicBaseURL, AnthropicAPIKey, AnthropicModel and
	// AnthropicThinking choose the model client, as in server.Config.
	Model             string
	AnthropicBaseURL  string
	AnthropicAPIKey   logging.Secret
	AnthropicModel    string
	AnthropicThinking string
	// MCPAllowPrivateNetworks is as in server.Config.
	MCPAllowPrivateNetworks bool
	// PolicyDir and OIDCIssuers are as in server.Config.
	PolicyDir string
	// NoWarmPools keeps the dev host from keeping the warm pools the
	// policy lists for its runtime.
	NoWarmPools bool
	// PausableSandboxes makes the dev host's gVisor sandboxes pausable, as
	// `corral host --pausable-sandboxes`: idle past the policy's
	// pause_after_idle_seconds, archived, or under memory pressure, a
	// sandbox is checkpointed instead of holding memory (or being evicted).
	PausableSandboxes bool
	// EgressAllowCIDRs are the private, loopback or link-local prefixes
	// the dev host's egress proxies may dial, as `corral host
	// --egress-allow-cidr` (a mirror on this machine: 127.0.0.1/32).
	EgressAllowCIDRs []netip.Prefix
	// PackageMirrors are as in server.Config.
	PackageMirrors []string
	// EgressUpstreamCAs are PEM files of CAs the dev host's egress
	// proxies trust besides the system roots, as `corral host
	// --egress-upstream-ca`.
	EgressUpstreamCAs []string
	OIDCIssuers       []auth.IssuerConfig
	Logger            *slog.Logger
	// Ready, if set, is called once the stack serves.
	Ready func(Info)
}

// Info describes a running stack.
type Info struct {
	URL      string // base URL of the HTTP API
	GRPCAddr string
	EnvFile  string // path of dev.env
	// MetricsURL and HostMetricsURL are the control plane's and the dev
	// host's /metrics ("" when off).
	MetricsURL, HostMetricsURL string
}

// Run starts the stack and blocks until ctx is done, then stops everything,
// PostgreSQL last.
func Run(ctx context.Context, opts Options) error {
	if opts.DataDir == "" {
		opts.DataDir = ".corral"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	log := opts.Logger
	dir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	unlock, err := lockDataDir(dir)
	if err != nil {
		return err
	}
	defer unlock()

	// Take the ports before starting anything slow, so a port in use fails
	// at once.
	httpLn, err := net.Listen("tcp", orDefault(opts.HTTPAddr, "127.0.0.1:8080"))
	if err != nil {
		return fmt.Errorf("http listener: %w", err)
	}
	grpcLn, err := net.Listen("tcp", orDefault(opts.GRPCAddr, "127.0.0.1:8090"))
	if err != nil {
		httpLn.Close()
		return fmt.Errorf("grpc listener: %w", err)
	}

	cfg := server.Config{
		NodeID:               opts.NodeID,
		HTTPListener:         httpLn,
		GRPCListener:         grpcLn,
		InsecureListen:       opts.InsecureListen,
		MetricsAddr:          opts.MetricsAddr,
		Tracing:              opts.Tracing,
		DatabaseURL:          opts.DatabaseURL,
		MigrationDatabaseURL: opts.MigrationDatabaseURL,
		// A one-node Raft cluster under the data dir, on ports of its own
		// each start: a lone node finds itself by id, not address.
		DataDir:                 filepath.Join(dir, "raft"),
		Bootstrap:               true,
		RaftAddr:                "127.0.0.1:0",
		RaftHTTPAddr:            "127.0.0.1:0",
		Model:                   opts.Model,
		AnthropicBaseURL:        opts.AnthropicBaseURL,
		AnthropicAPIKey:         opts.AnthropicAPIKey,
		AnthropicModel:          opts.AnthropicModel,
		AnthropicThinking:       opts.AnthropicThinking,
		MCPAllowPrivateNetworks: opts.MCPAllowPrivateNetworks,
		PackageMirrors:          opts.PackageMirrors,
		PolicyDir:               opts.PolicyDir,
		OIDCIssuers:             opts.OIDCIssuers,
		Logger:                  log,
		HostAddr:                orDefault(opts.HostAddr, "127.0.0.1:0"),
		SandboxRuntime:          pickRuntime(opts.Runtime, log),

		UnsafeAllowProcessRuntimeWithRealModel: opts.UnsafeAllowProcessRuntimeWithRealModel,
	}
	// Refuse a real model on an unisolated host before starting anything.
	if err := admission.CheckProcessRuntime(cfg.Model, cfg.SandboxRuntime, cfg.UnsafeAllowProcessRuntimeWithRealModel); err != nil {
		httpLn.Close()
		grpcLn.Close()
		return err
	}
	if opts.DatabaseURL == "" {
		pg, err := pglocal.Start(ctx, pglocal.Options{Dir: clusterDir(dir, log), Logger: log})
		if err != nil {
			httpLn.Close()
			grpcLn.Close()
			return fmt.Errorf("starting postgres: %w", err)
		}
		defer func() {
			if err := pg.Stop(context.Background()); err != nil {
				log.Warn("stopping postgres", "err", err)
			}
			log.Info("postgres stopped")
		}()
		cfg.DatabaseURL = pg.URL(pglocal.AppRole, pglocal.Database)
		cfg.MigrationDatabaseURL = pg.URL(pglocal.OwnerRole, pglocal.Database)
		// If postgres dies under us, stop rather than serve errors.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-pg.Exited():
				log.Error("postgres exited unexpectedly; shutting down", "log", filepath.Join(dir, "postgres", "postgres.log"))
				cancel()
			case <-ctx.Done():
			}
		}()
	}

	srv, err := server.New(ctx, cfg)
	if err != nil {
		return err
	}
	info := Info{
		URL:        "http://" + srv.HTTPAddr(),
		GRPCAddr:   srv.GRPCAddr(),
		EnvFile:    filepath.Join(dir, "dev.env"),
		MetricsURL: srv.MetricsURL(),
	}
	key, err := devKey(ctx, srv, info.EnvFile)
	if err != nil {
		srv.Run(canceled()) // releases listeners and the pool
		return err
	}
	opKey, err := devOperatorKey(ctx, srv, cfg.MigrationDatabaseURL, info.EnvFile)
	if err != nil {
		srv.Run(canceled())
		return err
	}
	if opKey == "" {
		log.Info("no owner database URL: dev.env gets no operator key (create one with corral admin bootstrap-key)")
	}
	var pools []agent.PoolClass
	if !opts.NoWarmPools {
		if pools, err = WarmPools(opts.PolicyDir, cfg.SandboxRuntime); err != nil {
			srv.Run(canceled())
			return err
		}
	}
	egressCfg := agent.EgressConfig{AllowCIDRs: opts.EgressAllowCIDRs}
	if egressCfg.UpstreamRoots, err = egress.UpstreamRoots(opts.EgressUpstreamCAs); err != nil {
		srv.Run(canceled())
		return fmt.Errorf("egress upstream CAs: %w", err)
	}
	host, err := startHost(ctx, srv, cfg.SandboxRuntime, filepath.Join(dir, "host"), pools, opts.PausableSandboxes, opts.HostMetricsAddr, opts.Tracing, egressCfg, log)
	if err != nil {
		srv.Run(canceled())
		return err
	}
	defer host.close()
	// dev.env once both daemons listen: it carries the host's metrics URL.
	info.HostMetricsURL = host.agent.MetricsURL()
	if err := writeEnv(info, key, opKey); err != nil {
		srv.Run(canceled())
		return err
	}
	hctx, stopHost := context.WithCancel(ctx)
	hostDone := make(chan struct{})
	go func() {
		if err := host.agent.Run(hctx); err != nil && hctx.Err() == nil {
			log.Error("the dev host agent stopped", "err", err)
		}
		close(hostDone)
	}()
	defer func() { stopHost(); <-hostDone }()
	// Listening means ready: a session created at once must find the host
	// (its registration, made after its canaries, is not instant on a busy
	// machine).
	if err := waitHostRegistered(ctx, srv, hostDone); err != nil {
		srv.Run(canceled())
		return err
	}
	log.Info("corral dev listening", "url", info.URL, "grpc", info.GRPCAddr, "hosts", srv.HostAddr(), "metrics", info.MetricsURL, "host_metrics", info.HostMetricsURL,
		"runtime", cfg.SandboxRuntime, "env_file", info.EnvFile, "data_dir", dir)
	if opts.Ready != nil {
		opts.Ready(info)
	}
	return srv.Run(ctx)
}

// clusterDir is where the private cluster lives: under the data dir, unless
// corral runs as root and the postgres user cannot reach it (a checkout under
// /root, say); then under /var/lib/corral, named after the data dir so that
// each data dir keeps its own cluster.
func clusterDir(dataDir string, log *slog.Logger) string {
	dir := filepath.Join(dataDir, "postgres")
	if err := pglocal.Reachable(dataDir, ""); err == nil {
		return dir
	}
	sum := sha256.Sum256([]byte(dataDir))
	alt := filepath.Join("/var/lib/corral", "dev-"+hex.EncodeToString(sum[:6]), "postgres")
	log.Info("the postgres user cannot reach the data dir; keeping the cluster elsewhere", "data_dir", dataDir, "cluster_dir", alt)
	_ = os.MkdirAll(filepath.Dir(alt), 0o755)
	return alt
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// devKey returns the tenant key recorded in dev.env if it still works (for
// the default tenant, with today's prefix, not revoked), and issues a new
// one otherwise.
func devKey(ctx context.Context, srv *server.Server, envFile string) (logging.Secret, error) {
	ctx = tenant.With(ctx, tenant.Default)
	keys := srv.Store().APIKeys()
	if old := readEnv(envFile)["CORRAL_API_KEY"]; strings.HasPrefix(old, store.APIKeyPrefix) {
		ki, err := keys.Authenticate(ctx, logging.Secret(old))
		if err == nil && ki.TenantID == tenant.Default && !ki.Revoked {
			return logging.Secret(old), nil
		}
		if err != nil && !errdefs.IsNotFound(err) {
			return "", fmt.Errorf("checking the dev api key: %w", err)
		}
	}
	_, secret, err := keys.Create(ctx, "corral dev")
	if err != nil {
		return "", fmt.Errorf("issuing the dev api key: %w", err)
	}
	return secret, nil
}

// devOperatorKey returns the operator key recorded in dev.env if it still
// works, and issues a new one as the owner otherwise; "" without an owner
// URL.
func devOperatorKey(ctx context.Context, srv *server.Server, ownerURL, envFile string) (logging.Secret, error) {
	if old := readEnv(envFile)["CORRAL_OPERATOR_KEY"]; old != "" {
		ki, err := srv.Store().APIKeys().Authenticate(ctx, logging.Secret(old))
		if err == nil && ki.TenantID == "" && !ki.Revoked {
			return logging.Secret(old), nil
		}
		if err != nil && !errdefs.IsNotFound(err) {
			return "", fmt.Errorf("checking the dev operator key: %w", err)
		}
	}
	if ownerURL == "" {
		return "", nil
	}
	_, secret, err := store.BootstrapOperatorKey(ctx, ownerURL, "corral-dev", []string{"operator"})
	if err != nil {
		return "", fmt.Errorf("issuing the dev operator key: %w", err)
	}
	return secret, nil
}

func writeEnv(info Info, key, opKey logging.Secret) error {
	content := fmt.Sprintf("# Written by corral dev; source it to talk to this instance.\nCORRAL_URL=%s\nCORRAL_GRPC_ADDR=%s\nCORRAL_API_KEY=%s\n",
		info.URL, info.GRPCAddr, key.Reveal())
	if opKey != "" {
		content += "CORRAL_OPERATOR_KEY=" + opKey.Reveal() + "\n"
	}
	if info.MetricsURL != "" {
		content += "CORRAL_METRICS_URL=" + info.MetricsURL + "\n"
	}
	if info.HostMetricsURL != "" {
		content += "CORRAL_HOST_METRICS_URL=" + info.HostMetricsURL + "\n"
	}
	tmp := info.EnvFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", info.EnvFile, err)
	}
	return os.Rename(tmp, info.EnvFile)
}

func readEnv(path string) map[string]string {
	env := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return env
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = v
		}
	}
	return env
}

// lockDataDir takes an exclusive lock on the data dir so that two corral dev
// processes never share one PostgreSQL cluster.
func lockDataDir(dir string) (func(), error) {
	path := filepath.Join(dir, "corral.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.Read(b)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			owner := strings.TrimSpace(string(b[:n]))
			if _, perr := strconv.Atoi(owner); perr != nil {
				owner = "unknown"
			}
			return nil, fmt.Errorf("data dir %s is in use by another corral process (pid %s)", dir, owner)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		_ = f.Truncate(0)
		f.Close()
	}, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// waitHostRegistered waits until this node's state has the dev host ready,
// woken by each change of the state; the host agent stopping, 2 minutes
// or ctx ending first is an error.
func waitHostRegistered(ctx context.Context, srv *server.Server, hostDone <-chan struct{}) error {
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for {
		changed := srv.Raft().Changed()
		ready := false
		srv.Raft().Read(func(v raftfsm.View) {
			h, ok := v.Host(devHostID)
			ready = ok && h.Status == scheduler.StatusReady
		})
		if ready {
			return nil
		}
		select {
		case <-changed:
		case <-hostDone:
			return errors.New("the dev host agent stopped before it registered (see its log above)")
		case <-deadline.C:
			return errors.New("the dev host agent did not register with the control plane within 2 minutes")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
