package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"corral.dev/corral/cmd/corral/internal/devstack"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/version"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

type globalFlags struct {
	logLevel, logFormat string
}

func (g *globalFlags) logger() (*slog.Logger, error) {
	return logging.New(os.Stderr, logging.Options{Level: g.logLevel, Format: g.logFormat})
}

func newRootCommand() *cobra.Command {
	var g globalFlags
	root := &cobra.Command{
		Use:           "corral",
		Short:         "Run AI agents for many tenants on your own fleet",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", envOr("CORRAL_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", envOr("CORRAL_LOG_FORMAT", "text"), "log format: text or json")
	root.AddCommand(devCommand(&g), serverCommand(&g), migrateCommand(&g), statusCommand(), adminCommand(), versionCommand())
	root.AddCommand(hostCommand(&g), hostctlCommand(&g))
	root.AddCommand(hostsCommand(), sandboxesCommand(), clusterCommand())
	root.AddCommand(sessionsCommand(), agentsCommand(), usageCommand(), egressCommand(), buildsCommand())
	return root
}

func devCommand(g *globalFlags) *cobra.Command {
	var o devstack.Options
	var oidcConfig string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run corral on this machine: private PostgreSQL, a one-node control plane and a sandbox host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			o.Logger = log
			if o.OIDCIssuers, err = loadIssuers(oidcConfig); err != nil {
				return err
			}
			return devstack.Run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", ".corral", "directory for the private PostgreSQL cluster, dev.env and the lock")
	f.StringVar(&o.DatabaseURL, "database-url", os.Getenv("CORRAL_DATABASE_URL"), "use this PostgreSQL (application role) instead of a private one")
	f.StringVar(&o.MigrationDatabaseURL, "migration-database-url", os.Getenv("CORRAL_MIGRATION_DATABASE_URL"), "owner role URL for migrations, with --database-url")
	f.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:8080", "HTTP listen address (REST API, health)")
	f.StringVar(&o.GRPCAddr, "grpc-addr", "127.0.0.1:8090", "gRPC listen address (admin API)")
	insecureListenFlag(cmd, &o.InsecureListen)
	f.StringVar(&o.NodeID, "node-id", "", "node id (default: host name)")
	f.StringVar(&o.HostAddr, "host-addr", "127.0.0.1:0", "listen address of the host service, for hosts beyond the dev stack's own")
	f.StringVar(&o.MetricsAddr, "metrics-addr", "127.0.0.1:0", "listen address of the control plane's Prometheus metrics (default: any free loopback port; written to dev.env as CORRAL_METRICS_URL; empty: off)")
	f.StringVar(&o.HostMetricsAddr, "host-metrics-addr", "127.0.0.1:0", "listen address of the dev host's Prometheus metrics (written to dev.env as CORRAL_HOST_METRICS_URL; empty: off)")
	f.BoolVar(&o.NoWarmPools, "no-warm-pools", false, "keep no warm pool on the dev host (default: the pools policy/runtimes.yaml lists for its runtime)")
	cmd.Flags().Func("egress-allow-cidr", "private, loopback or link-local prefix the dev host's egress proxies may dial, e.g. 127.0.0.1/32 for a mirror on this machine (repeatable; default: only public addresses)", func(s string) error {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return err
		}
		o.EgressAllowCIDRs = append(o.EgressAllowCIDRs, p.Masked())
		return nil
	})
	f.StringSliceVar(&o.EgressUpstreamCAs, "egress-upstream-ca", nil, "PEM file of a CA the dev host's egress proxies trust, besides the system roots, for the upstreams they inject credentials toward (repeatable)")
	packageMirrorFlag(cmd, &o.PackageMirrors)
	f.BoolVar(&o.PausableSandboxes, "pausable-sandboxes", false, "make the dev host's gVisor sandboxes pausable (runsc checkpoint), as corral host --pausable-sandboxes: idle, archived and memory-pressed sandboxes are then paused")
	f.StringVar(&o.Runtime, "runtime", os.Getenv("CORRAL_SANDBOX_RUNTIME"), "the dev host's sandbox runtime: gvisor, runc or process (default: gvisor when root with scripts/runtime installed, else process)")
	f.BoolVar(&o.UnsafeAllowProcessRuntimeWithRealModel, unsafeProcessFlag, false, "UNSAFE: let a real model's commands run in process sandboxes, which isolate nothing")
	securityFlags(cmd, &o.PolicyDir, &oidcConfig)
	modelFlags(cmd, &o.Model, &o.AnthropicBaseURL, &o.AnthropicModel, &o.AnthropicThinking, &o.AnthropicAPIKey)
	mcpFlags(cmd, &o.MCPAllowPrivateNetworks)
	otlpFlags(cmd, &o.Tracing)
	return cmd
}

// mcpFlags configure the control plane's MCP client.
func mcpFlags(cmd *cobra.Command, allowPrivate *bool) {
	cmd.Flags().BoolVar(allowPrivate, "mcp-allow-private-networks", false, "let agents' MCP servers be on loopback, private or link-local addresses (the control plane calls them from inside its network)")
}

// insecureListenFlag lets the HTTP and gRPC listeners serve plaintext
// beyond loopback.
func insecureListenFlag(cmd *cobra.Command, v *bool) {
	cmd.Flags().BoolVar(v, "insecure-listen", false, "UNSAFE: serve the REST and gRPC APIs in plaintext on an address beyond loopback (keys cross the network in the clear)")
}

// securityFlags adds the policy and OIDC flags to cmd.
func securityFlags(cmd *cobra.Command, policyDir, oidcConfig *string) {
	f := cmd.Flags()
	f.StringVar(policyDir, "policy-dir", os.Getenv("CORRAL_POLICY_DIR"), "directory with roles.yaml, quotas.yaml, runtimes.yaml and optionally placement.yaml (host pools) replacing the built-in policy")
	f.StringVar(oidcConfig, "oidc-config", os.Getenv("CORRAL_OIDC_CONFIG"), "YAML file listing the OpenID Providers whose tokens are accepted (see README)")
}

// unsafeProcessFlag lets a real model's commands run in process sandboxes.
const unsafeProcessFlag = "unsafe-allow-process-runtime-with-real-model"

// sandboxFlags adds the sessions' sandbox runtime flags to cmd.
func sandboxFlags(cmd *cobra.Command, runtime *string, unsafeProcess *bool) {
	f := cmd.Flags()
	f.StringVar(runtime, "sandbox-runtime", envOr("CORRAL_SANDBOX_RUNTIME", ""), "runtime sessions' sandboxes ask hosts for: gvisor (default), runc or process (development only)")
	f.BoolVar(unsafeProcess, unsafeProcessFlag, false, "UNSAFE: let a real model's commands run in process sandboxes, which isolate nothing (they run on the host as the host agent's user)")
}

// packageMirrorFlag adds --package-mirror: where environments' packages
// come from.
func packageMirrorFlag(cmd *cobra.Command, v *[]string) {
	cmd.Flags().StringSliceVar(v, "package-mirror", nil, "package mirror environments' packages are installed from, manager=URL (apt, cargo, gem, go, npm, pip; comma-separated or repeated). apt takes a sources.list entry after \"deb\": 'apt=[trusted=yes] http://mirror/ ./' or 'apt=http://mirror/debian bookworm main'. Build sandboxes reach only these; allow_package_managers lets sessions reach them. Default: none (packages are refused)")
}

// s3Flags adds the S3 blob store's flags to cmd; the secret key comes from
// the environment only.
func s3Flags(cmd *cobra.Command, c *blob.S3Config) {
	f := cmd.Flags()
	f.StringVar(&c.Endpoint, "blob-s3-endpoint", os.Getenv("CORRAL_BLOB_S3_ENDPOINT"), "host:port of an S3 API keeping drained workspaces instead of --blob-dir")
	f.StringVar(&c.Bucket, "blob-s3-bucket", os.Getenv("CORRAL_BLOB_S3_BUCKET"), "S3 bucket, with --blob-s3-endpoint")
	f.BoolVar(&c.Insecure, "blob-s3-insecure", false, "speak plain HTTP to the S3 endpoint (a private network only)")
	f.BoolVar(&c.PathStyle, "blob-s3-path-style", true, "address the bucket in the path (S3-compatible servers other than AWS)")
	f.StringVar(&c.AccessKey, "blob-s3-access-key", os.Getenv("CORRAL_BLOB_S3_ACCESS_KEY"), "S3 access key id (secret key from $CORRAL_BLOB_S3_SECRET_KEY)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(cc *cobra.Command, args []string) error {
		c.SecretKey = logging.Secret(os.Getenv("CORRAL_BLOB_S3_SECRET_KEY"))
		if prev != nil {
			return prev(cc, args)
		}
		return nil
	}
}

// loadIssuers reads the OIDC configuration file, if one is named.
func loadIssuers(path string) ([]auth.IssuerConfig, error) {
	if path == "" {
		return nil, nil
	}
	return auth.LoadIssuers(path)
}

// anthropicKeyEnv is the only place the Anthropic API key is read from: a
// flag would show it in process listings.
const anthropicKeyEnv = "CORRAL_ANTHROPIC_API_KEY"

// modelFlags adds the model client's flags to cmd; the API key comes from
// the environment when the command runs.
func modelFlags(cmd *cobra.Command, name, baseURL, defaultModel, thinking *string, key *logging.Secret) {
	f := cmd.Flags()
	f.StringVar(name, "model", envOr("CORRAL_MODEL", "fake"), "model client: fake (offline, scriptable) or anthropic (Messages API; API key from $"+anthropicKeyEnv+")")
	f.StringVar(baseURL, "anthropic-base-url", os.Getenv("CORRAL_ANTHROPIC_BASE_URL"), "Messages API base URL with --model anthropic (default https://api.anthropic.com)")
	f.StringVar(defaultModel, "anthropic-model", os.Getenv("CORRAL_ANTHROPIC_MODEL"), "model id for agents that name none, with --model anthropic")
	f.StringVar(thinking, "anthropic-thinking", os.Getenv("CORRAL_ANTHROPIC_THINKING"), "extended thinking in every model request, with --model anthropic: adaptive, or enabled:N for a budget of N tokens (default off)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		*key = logging.Secret(os.Getenv(anthropicKeyEnv))
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

func serverCommand(g *globalFlags) *cobra.Command {
	var cfg server.Config
	var oidcConfig string
	var blobS3 blob.S3Config
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a control-plane node against an existing PostgreSQL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			cfg.Logger = log
			if cfg.OIDCIssuers, err = loadIssuers(oidcConfig); err != nil {
				return err
			}
			if blobS3.Endpoint != "" {
				if cfg.Blobs, err = blob.NewS3(blobS3); err != nil {
					return err
				}
			}
			srv, err := server.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			log.Info("corral server listening", "http", srv.HTTPAddr(), "grpc", srv.GRPCAddr(), "hosts", srv.HostAddr(), "metrics", srv.MetricsURL())
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("CORRAL_DATABASE_URL"), "PostgreSQL URL of the application role (required)")
	f.StringVar(&cfg.MigrationDatabaseURL, "migration-database-url", os.Getenv("CORRAL_MIGRATION_DATABASE_URL"), "PostgreSQL URL of the owner role; when set, migrations run at start")
	f.StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:8080", "HTTP listen address (REST API, health)")
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:8090", "gRPC listen address (admin API)")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", os.Getenv("CORRAL_METRICS_ADDR"), "listen address serving Prometheus metrics on /metrics (default: off); beyond loopback it needs --tls-cert or --insecure-listen, as the APIs do (metrics name tenants)")
	f.StringVar(&cfg.TLSCertFile, "tls-cert", os.Getenv("CORRAL_TLS_CERT"), "PEM certificate (chain) the HTTP and gRPC listeners serve over TLS; reloaded on SIGHUP and when it changes")
	f.StringVar(&cfg.TLSKeyFile, "tls-key", os.Getenv("CORRAL_TLS_KEY"), "PEM private key of --tls-cert")
	insecureListenFlag(cmd, &cfg.InsecureListen)
	f.StringVar(&cfg.NodeID, "node-id", "", "node id (default: host name)")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "how long graceful shutdown may take")
	f.StringVar(&cfg.DataDir, "data-dir", envOr("CORRAL_DATA_DIR", ".corral/server"), "directory of this node's Raft log and snapshots")
	f.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:8300", "Raft transport address (listened on and advertised; a concrete host)")
	f.StringVar(&cfg.RaftHTTPAddr, "raft-http-addr", "127.0.0.1:8301", "listen address for writes and membership calls forwarded by other nodes")
	f.BoolVar(&cfg.Bootstrap, "bootstrap", false, "first start of the first node: make it a new one-node cluster")
	f.StringVar(&cfg.Join, "join", "", "first start of another node: join the cluster through this member's --raft-http-addr")
	f.DurationVar(&cfg.JoinTimeout, "join-timeout", 30*time.Second, "how long a first start may try to join")
	nodeTrustFlags(cmd, &cfg.SealKeyFile, &cfg.NodeJoinToken)
	f.DurationVar(&cfg.RaftHeartbeatTimeout, "raft-heartbeat-timeout", 0, "Raft heartbeat timeout (0: 1s)")
	f.DurationVar(&cfg.RaftElectionTimeout, "raft-election-timeout", 0, "Raft election timeout (0: 1s)")
	f.Uint64Var(&cfg.RaftSnapshotThreshold, "raft-snapshot-threshold", 0, "log entries that trigger a Raft snapshot (0: 8192)")
	f.DurationVar(&cfg.RaftSnapshotInterval, "raft-snapshot-interval", 0, "how often the snapshot threshold is checked (0: 2m)")
	f.StringVar(&cfg.HostAddr, "host-addr", "127.0.0.1:8443", "listen address of the host service that host agents join and connect to (mutual TLS)")
	f.StringVar(&cfg.HostAdvertise, "host-advertise", "", "host service address hosts dial for this node (default: --host-addr, which must then be concrete)")
	f.DurationVar(&cfg.HostHeartbeatInterval, "host-heartbeat-interval", 10*time.Second, "heartbeat interval hosts are told to use")
	f.DurationVar(&cfg.HostTTL, "host-ttl", 0, "a host not heard from for this long is down and its sandboxes move (0: 3 heartbeats)")
	f.StringVar(&cfg.BlobDir, "blob-dir", "", "directory keeping workspaces while a drain moves them, and the Files API's content (default <data-dir>/blobs; shared by the nodes unless --blob-s3-endpoint)")
	f.DurationVar(&cfg.WorkLeaseTTL, "work-lease-ttl", 0, "how long a self-hosted worker's lease on a session lasts after each heartbeat (0: 120s)")
	f.Int64Var(&cfg.FileMaxBytes, "file-max-bytes", 0, "largest file an upload to the Files API takes, in bytes (0: 500 MiB; a tenant's files together are bounded by its quota's file_storage_mib)")
	s3Flags(cmd, &blobS3)
	sandboxFlags(cmd, &cfg.SandboxRuntime, &cfg.UnsafeAllowProcessRuntimeWithRealModel)
	packageMirrorFlag(cmd, &cfg.PackageMirrors)
	cmd.Flags().DurationVar(&cfg.BuildRetention, "build-retention", 24*time.Hour, "how long an environment package build no session uses is kept (its image on the hosts and in the blob store) after it was last asked for")
	securityFlags(cmd, &cfg.PolicyDir, &oidcConfig)
	modelFlags(cmd, &cfg.Model, &cfg.AnthropicBaseURL, &cfg.AnthropicModel, &cfg.AnthropicThinking, &cfg.AnthropicAPIKey)
	mcpFlags(cmd, &cfg.MCPAllowPrivateNetworks)
	otlpFlags(cmd, &cfg.Tracing)
	return cmd
}

func migrateCommand(g *globalFlags) *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending database migrations (safe to run from several nodes at once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url == "" {
				return fmt.Errorf("--database-url is required (the owner role's URL)")
			}
			log, err := g.logger()
			if err != nil {
				return err
			}
			res, err := store.Migrate(cmd.Context(), url, log)
			if err != nil {
				return err
			}
			fmt.Printf("schema at version %d (%d migrations applied now)\n", res.Version, len(res.Applied))
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "database-url", os.Getenv("CORRAL_MIGRATION_DATABASE_URL"), "PostgreSQL URL of the role that owns the tables")
	return cmd
}

func statusCommand() *cobra.Command {
	var a adminConn
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the status of a control-plane node (admin API; needs an operator key)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), func(ctx context.Context, conn *grpc.ClientConn) (proto.Message, error) {
				return adminv1.NewClusterServiceClient(conn).GetStatus(ctx, &adminv1.GetStatusRequest{})
			})
		},
	}
	a.flags(cmd)
	return cmd
}

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(*cobra.Command, []string) { fmt.Println(version.String()) },
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
