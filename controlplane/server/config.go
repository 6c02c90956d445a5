package server

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/tracing"
)

// Config is a control-plane node's configuration. Flags map onto it.
type Config struct {
	// NodeID names this node; default the host name.
	NodeID string
	// HTTPAddr serves /healthz, /readyz and the REST APIs. Default 127.0.0.1:8080.
	HTTPAddr string
	// GRPCAddr serves the gRPC admin API. Default 127.0.0.1:8090.
	GRPCAddr string
	// HTTPListener and GRPCListener, when set, are used instead of listening
	// on the addresses (callers that must know the ports are free before
	// starting anything else).
	HTTPListener net.Listener
	GRPCListener net.Listener
	// TLSCertFile and TLSKeyFile, given together, are the PEM certificate
	// (chain) and key the HTTP and gRPC listeners serve, TLS 1.2 or later.
	// The pair is read again on SIGHUP and when either file changes (looked
	// for every TLSReloadInterval, default 1s); a pair that does not load
	// is logged and the previous one kept.
	TLSCertFile, TLSKeyFile string
	TLSReloadInterval       time.Duration
	// InsecureListen lets the HTTP and gRPC listeners serve plaintext on
	// an address beyond loopback (logged as a warning for each). Without
	// it, and without a certificate, such an address refuses to start.
	InsecureListen bool
	// MetricsAddr, when set, serves Prometheus metrics on /metrics (and
	// nothing else), under the public listeners' rules: TLS with the
	// certificate when there is one, plaintext beyond loopback only with
	// InsecureListen (metrics name tenants). Default: off.
	MetricsAddr string
	// Tracing exports OpenTelemetry traces when its Endpoint is set
	// (tracing.go); ServiceName, NodeID and Version are filled in.
	// Default: off, with no exporter.
	Tracing tracing.Config
	// DatabaseURL connects as the application role. Required.
	DatabaseURL string
	// MigrationDatabaseURL connects as the owner role; when set, migrations
	// are applied at start. When empty the node only checks that the schema
	// is current.
	MigrationDatabaseURL string
	// Model names the model client sessions run on: "fake" (the default),
	// the offline, scriptable model, or "anthropic", the Messages API.
	Model string
	// AnthropicBaseURL is the Messages API's base URL with Model
	// "anthropic"; default https://api.anthropic.com.
	AnthropicBaseURL string
	// AnthropicAPIKey is required with Model "anthropic". The commands read
	// it from CORRAL_ANTHROPIC_API_KEY only, never from a flag, so that it
	// does not show in process listings; it never prints in logs.
	AnthropicAPIKey logging.Secret
	// AnthropicModel is the model id for agents that name none.
	AnthropicModel string
	// AnthropicThinking enables the model's extended thinking in every
	// request of every session: "" (off), "adaptive", or "enabled:N" with
	// a budget of N tokens (at least 1024, below the loop's 4096 max
	// tokens). The Managed Agents agent has no thinking field, so this is
	// the operator's choice; agent.thinking events show it to clients.
	AnthropicThinking string
	// DataDir holds this node's Raft log, stable store and snapshots.
	// Required. A node restarted from its data directory rejoins its cluster.
	DataDir string
	// RaftAddr is the Raft transport's listen and advertised address, a
	// concrete host (port 0 picks one). Default 127.0.0.1:8300.
	RaftAddr string
	// RaftHTTPAddr serves the other nodes' forwarded writes and membership
	// calls. Default 127.0.0.1:8301.
	RaftHTTPAddr string
	// Bootstrap makes this node a new one-node cluster on its first start;
	// Join is the Raft HTTP address of any member of an existing cluster,
	// asked to add this node on its first start. A first start needs one of
	// them; later starts ignore both.
	Bootstrap bool
	Join      string
	// NodeJoinToken is the one-time token a joining node's first start
	// trades for its node certificate (`corral admin node-token` on a
	// member). Nodes speak mutual TLS to each other with those
	// certificates; later starts read theirs from DataDir/node.
	NodeJoinToken logging.Secret
	// SealKeyFile is the seal keyring shared by every node of the cluster:
	// the CA keys in Raft and this node's key are sealed with it. Empty on
	// a bootstrap node's first start: DataDir/seal.key is generated.
	SealKeyFile string
	// JoinTimeout bounds a first start's join. Default 30s.
	JoinTimeout time.Duration
	// RaftHeartbeatTimeout and RaftElectionTimeout are Raft's timers; zero
	// takes hashicorp/raft's defaults (1s each).
	RaftHeartbeatTimeout time.Duration
	RaftElectionTimeout  time.Duration
	// RaftSnapshotThreshold is how many log entries trigger a snapshot, and
	// RaftSnapshotInterval how often that is checked; zero takes
	// hashicorp/raft's defaults (8192 entries, 2 minutes).
	RaftSnapshotThreshold uint64
	RaftSnapshotInterval  time.Duration
	// RunnerGrace is how long a node's Raft heartbeats may fail before the
	// leader moves the sessions it runs to other nodes; RunnerInterval is
	// how often that, and this node's newly assigned sessions, are looked
	// for. Defaults 5s and 1s.
	RunnerGrace    time.Duration
	RunnerInterval time.Duration
	// MaxRounds caps model requests per turn. Default 20.
	MaxRounds int
	// MCPAllowPrivateNetworks lets the MCP client reach servers on
	// loopback, private and link-local addresses. Off, an agent's
	// mcp_servers URLs cannot point the control plane into its own network
	// (development and tests turn it on for MCP servers on loopback).
	// The same holds for the base URL of a tenant's own model_api_key
	// credential: with it, http to loopback is allowed as well as https.
	MCPAllowPrivateNetworks bool
	// PolicyDir, when set, is a directory with roles.yaml, quotas.yaml,
	// runtimes.yaml and optionally placement.yaml (host pools) to use
	// instead of the embedded policy. An invalid policy refuses to start.
	PolicyDir string
	// OIDCIssuers are the OpenID Providers whose tokens are accepted.
	OIDCIssuers []auth.IssuerConfig
	// HostAddr serves HostService to host agents (mutual TLS after their
	// join). Default 127.0.0.1:8443. HostListener, when set, is used
	// instead. HostAdvertise is the address hosts dial for this node
	// (default: the listener's, which must then be a concrete address).
	HostAddr      string
	HostListener  net.Listener
	HostAdvertise string
	// HostHeartbeatInterval is what hosts are told (default 10s); a host
	// not heard from for HostTTL is down and its sandboxes move (default 3
	// heartbeats).
	HostHeartbeatInterval time.Duration
	HostTTL               time.Duration
	// BlobDir keeps workspaces while a drain moves them; default
	// <DataDir>/blobs. Blobs, when set (an S3 bucket shared by the nodes),
	// is used instead.
	BlobDir string
	Blobs   blob.Store
	// FileMaxBytes bounds one file of the Files API (uploads; larger:
	// 413). Default publicapi.DefaultFileMaxBytes, 500 MiB. A tenant's
	// files together are bounded by its quota's file_storage_mib.
	FileMaxBytes int64
	// WorkLeaseTTL is how long a self-hosted work item's lease lasts after
	// each heartbeat (a worker beats at half of it). Default
	// publicapi.DefaultWorkLeaseTTL, 120s: a worker that died lets another
	// take its session that long after its last heartbeat.
	WorkLeaseTTL time.Duration
	// SandboxRuntime is the runtime sessions' sandboxes ask for: gvisor
	// (the default), runc or process. The environment's config in the
	// Managed Agents API names no runtime, so this is the fleet's choice;
	// the profile's limits come from policy/runtimes.yaml.
	SandboxRuntime string
	// SandboxImage is the image sandboxes run (default
	// DefaultSandboxImage; the process runtime ignores it).
	SandboxImage string
	// PackageMirrors are the operator's package mirrors, each
	// "manager=URL" (apt's URL may carry a sources.list entry's options
	// and suite: envbuild.ParseMirrors): environments' packages are
	// installed from these alone, in build sandboxes that reach nothing
	// else, and allow_package_managers lets sandboxes reach them. None:
	// packages and allow_package_managers are refused.
	PackageMirrors []string
	// BuildRetention is how long a package build no session uses is kept
	// (its image on the hosts and in the blob store) after it was last
	// asked for. Default 24h.
	BuildRetention time.Duration
	// SandboxReadyTimeout bounds the wait for a new sandbox. Default 2m.
	SandboxReadyTimeout time.Duration
	// PauseAfterIdle, when set, overrides the runtime profile's
	// pause_after_idle_seconds (tests; a negative value never pauses).
	PauseAfterIdle time.Duration
	// ArchiveReleaseAfter, when set, overrides the runtime profile's
	// archive_release_after_seconds (tests; a negative value releases an
	// archived session's sandbox at once).
	ArchiveReleaseAfter time.Duration
	// SweepInterval is how often the leader releases the placements of
	// sessions that no longer exist. Default 5s.
	SweepInterval time.Duration
	// UnsafeAllowProcessRuntimeWithRealModel lets a real model's tool
	// calls run in process sandboxes, which isolate nothing. Without it a
	// node with a real model refuses the process runtime at start and
	// refuses to place a session on a process host.
	UnsafeAllowProcessRuntimeWithRealModel bool
	// SandboxQuota receives tenants' sandbox limits when an operator sets
	// them, and SandboxReaper destroys a deleted tenant's sandboxes. When
	// nil, the node's fleet does both (tests replace them).
	SandboxQuota  quota.SandboxQuotaSetter
	SandboxReaper api.SandboxReaper
	// ShutdownTimeout bounds graceful shutdown. Default 15s.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
}

// Validate fills defaults and reports the first bad field.
func (c *Config) Validate() error {
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("node id: %w", err)
		}
		c.NodeID = h
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:8080"
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = "127.0.0.1:8090"
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 15 * time.Second
	}
	if c.FileMaxBytes == 0 {
		c.FileMaxBytes = publicapi.DefaultFileMaxBytes
	}
	if c.WorkLeaseTTL == 0 {
		c.WorkLeaseTTL = publicapi.DefaultWorkLeaseTTL
	}
	if c.WorkLeaseTTL < time.Second {
		return errdefs.InvalidArgument("the work lease (--work-lease-ttl) must be at least 1s")
	}
	if c.FileMaxBytes < 0 {
		return errdefs.InvalidArgument("the file size limit (--file-max-bytes) must not be negative")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.DatabaseURL == "" {
		return errdefs.InvalidArgument("a database URL is required (--database-url)")
	}
	if c.DataDir == "" {
		return errdefs.InvalidArgument("a data directory is required (--data-dir)")
	}
	if c.RaftAddr == "" {
		c.RaftAddr = "127.0.0.1:8300"
	}
	if c.RaftHTTPAddr == "" {
		c.RaftHTTPAddr = "127.0.0.1:8301"
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = 30 * time.Second
	}
	if c.Bootstrap && c.Join != "" {
		return errdefs.InvalidArgument("--bootstrap and --join are exclusive: bootstrap the first node, join the others")
	}
	if c.Model == "" {
		c.Model = "fake"
	}
	switch c.Model {
	case "fake":
	case "anthropic":
		if c.AnthropicAPIKey == "" {
			return errdefs.InvalidArgument("model anthropic needs an API key (set CORRAL_ANTHROPIC_API_KEY)")
		}
	default:
		return errdefs.InvalidArgument("unknown model client %q (this release has: fake, anthropic)", c.Model)
	}
	if _, err := c.thinking(); err != nil {
		return err
	}
	if c.MaxRounds < 0 {
		return errdefs.InvalidArgument("max rounds must not be negative")
	}
	if err := c.validateListen(); err != nil {
		return err
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	return c.validateFleet()
}

// thinking is AnthropicThinking parsed (nil: off).
func (c *Config) thinking() (*model.Thinking, error) {
	v := c.AnthropicThinking
	if v == "" {
		return nil, nil
	}
	if c.Model != "anthropic" {
		return nil, errdefs.InvalidArgument("anthropic thinking %q needs model anthropic", v)
	}
	t := &model.Thinking{Type: v}
	if budget, ok := strings.CutPrefix(v, "enabled:"); ok {
		n, err := strconv.Atoi(budget)
		if err != nil {
			return nil, errdefs.InvalidArgument("anthropic thinking %q: the budget must be a number of tokens", v)
		}
		t = &model.Thinking{Type: "enabled", BudgetTokens: n}
	}
	if t.Type == "enabled" && t.BudgetTokens == 0 {
		return nil, errdefs.InvalidArgument("anthropic thinking %q: give a budget, as enabled:N", v)
	}
	if err := t.Validate(); err != nil {
		return nil, errdefs.InvalidArgument("anthropic %v", err)
	}
	if t.BudgetTokens >= maxTokens {
		return nil, errdefs.InvalidArgument("anthropic thinking %q: the budget must be below the %d tokens of a model request", v, maxTokens)
	}
	return t, nil
}

// maxTokens is the agent loop's max_tokens per model request (its default).
const maxTokens = 4096
