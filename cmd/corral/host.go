package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"corral.dev/corral/cmd/corral/internal/devstack"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/version"
)

// hostFlags are `corral host`'s flags beyond agent.Config.
type hostFlags struct {
	joinToken         string
	runtimes          []string
	containerdAddress string
	runsc             string
	gvisorShim        string
	pullImages        bool
	plainHTTP         []string
	allowProcess      bool
	canaryImage       string
	noWarmPools       bool
	pausable          bool
	spawnBinary       string
	spawnBinarySet    bool // named on the command line: it must be there
	policyDir         string
	memPressure       float64
	diskPressure      float64
	egressAllowCIDRs  []string
	egressUpstreamCAs []string
}

func hostCommand(g *globalFlags) *cobra.Command {
	var (
		cfg agent.Config
		f   hostFlags
	)
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Run the host agent: join the control plane and run its sandboxes here",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			cfg.Logger = log
			f.spawnBinarySet = cmd.Flags().Changed("spawn-binary")
			cfg.JoinToken = logging.Secret(f.joinToken)
			cfg.Version = version.String()
			if cfg.HostID == "" {
				if cfg.HostID, err = defaultHostID(); err != nil {
					return err
				}
			}
			if cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
				return err
			}
			if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
				return fmt.Errorf("creating state dir: %w", err)
			}
			ctx := cmd.Context()
			closeDrivers, err := newHostRuntimes(ctx, &cfg, f, log)
			if err != nil {
				return err
			}
			defer closeDrivers()
			if cfg.Capacity == (agent.Resources{}) {
				if cfg.Capacity, err = agent.HostResources(cfg.StateDir); err != nil {
					return err
				}
			}
			cfg.Pressure = agent.HostPressure(cfg.StateDir, f.memPressure, f.diskPressure)
			cfg.Usage = agent.HostUsage(cfg.StateDir)
			if cd := firstContainerd(cfg.Runtimes); cd != nil {
				cfg.Images = func(ctx context.Context) ([]string, error) {
					imgs, err := cd.Client().ListImages(ctx)
					if err != nil {
						return nil, err
					}
					names := make([]string, 0, len(imgs))
					for _, img := range imgs {
						names = append(names, img.Name())
					}
					return names, nil
				}
				cfg.Checks = append(cfg.Checks, agent.Check{Type: "containerd_reachable", Run: func(ctx context.Context) error {
					ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					_, err := cd.Client().Version(ctx)
					return err
				}})
			}
			if cfg.Providers, err = hostProviders(cfg, f); err != nil {
				return err
			}
			if !f.noWarmPools {
				for _, r := range cfg.Runtimes {
					pools, err := devstack.WarmPools(f.policyDir, r.Name)
					if err != nil {
						return err
					}
					cfg.Pools = append(cfg.Pools, pools...)
				}
			}
			for _, s := range f.egressAllowCIDRs {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					return fmt.Errorf("--egress-allow-cidr %q: %w", s, err)
				}
				cfg.Egress.AllowCIDRs = append(cfg.Egress.AllowCIDRs, p.Masked())
			}
			if cfg.Egress.UpstreamRoots, err = egress.UpstreamRoots(f.egressUpstreamCAs); err != nil {
				return fmt.Errorf("--egress-upstream-ca: %w", err)
			}
			a, err := agent.New(ctx, cfg)
			if err != nil {
				return err
			}
			log.Info("corral host running", "host_id", cfg.HostID, "runtimes", f.runtimes,
				"sandbox_service", a.SandboxAddr(), "control_plane", cfg.ControlPlane, "state_dir", cfg.StateDir, "metrics", a.MetricsURL())
			return a.Run(ctx)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.ControlPlane, "control-plane", os.Getenv("CORRAL_CONTROL_PLANE"), "host:port of the control plane's host service, or a comma-separated list of every node's: the agent follows the leader (required)")
	fl.StringVar(&f.joinToken, "join-token", os.Getenv("CORRAL_JOIN_TOKEN"), "one-time join token, needed until this host has its certificate (env CORRAL_JOIN_TOKEN)")
	fl.StringVar(&cfg.HostID, "host-id", "", "this host's id, a DNS label (default: the host name)")
	fl.StringVar(&cfg.StateDir, "state-dir", "/var/lib/corral/host", "directory for the host certificate, sandbox records and kept workspaces")
	fl.StringVar(&cfg.ListenAddr, "listen", "127.0.0.1:8443", "listen address of the sandbox service (mutual TLS)")
	fl.StringVar(&cfg.MetricsAddr, "metrics-addr", os.Getenv("CORRAL_METRICS_ADDR"), "listen address serving Prometheus metrics on /metrics, in plaintext (default: off; beyond loopback only with --metrics-insecure-listen)")
	fl.BoolVar(&cfg.MetricsInsecureListen, "metrics-insecure-listen", false, "UNSAFE: serve --metrics-addr in plaintext on an address beyond loopback")
	otlpFlags(cmd, &cfg.Tracing)
	fl.StringVar(&cfg.AdvertiseAddr, "advertise", "", "sandbox service address given to the control plane (default: the listen address)")
	fl.StringSliceVar(&f.runtimes, "runtime", []string{containerd.RuntimeGVisor}, "sandbox runtimes this host offers, the first its default: gvisor, runc, process (development only), comma-separated or repeated, e.g. gvisor,runc")
	fl.StringVar(&f.containerdAddress, "containerd-address", containerd.DefaultAddress, "containerd socket")
	fl.StringVar(&f.runsc, "runsc", containerd.DefaultRunscPath, "runsc binary, for --runtime gvisor")
	fl.BoolVar(&f.pullImages, "pull-images", false, "pull images that are not present from their registry (default: only imported images)")
	fl.StringSliceVar(&f.plainHTTP, "plain-http-registry", nil, "registry host:port reached over plain HTTP instead of HTTPS (repeatable)")
	fl.StringVar(&f.gvisorShim, "gvisor-shim", containerd.ShimRunc, "how containerd runs runsc: runc (the runc shim with runsc as its binary) or runsc (gVisor's shim)")
	fl.StringVar(&cfg.GVisorPlatform, "gvisor-platform", "systrap", "gVisor platform: systrap, ptrace, or kvm (needs /dev/kvm usable; the provider's canary tells whether sandboxes run on it)")
	fl.BoolVar(&f.allowProcess, "allow-untrusted-process-runtime", false, "acknowledge that --runtime process isolates nothing (development only)")
	fl.StringVar(&f.canaryImage, "canary-image", "localhost/corral/busybox:1", "image of the provider's canary sandbox, booted every 5 minutes while it passes and at every canary while it fails (empty: no canary sandbox, only the runtime binary's check)")
	fl.DurationVar(&cfg.CanaryInterval, "canary-interval", time.Minute, "how often each provider's canary runs (its runtime binary's check; a provider that fails it takes no new placements here)")
	fl.BoolVar(&f.pausable, "pausable-sandboxes", false, "make gVisor sandboxes pausable (runsc checkpoint) when idle past the policy's pause_after_idle_seconds, archived, or idle under memory pressure (paused before any is evicted): every command then runs under the sandbox's init, through --spawn-binary")
	fl.StringVar(&f.spawnBinary, "spawn-binary", containerd.SpawnBinaryBeside(), "the compiled spawner (make build's bin/corral-spawn) that gVisor sandboxes run their commands through (a command server kept in each sandbox: no runsc exec per command); named here, it must exist; by default, if it is missing, the host warns once, runs each command as a runsc exec of its own, and pausable sandboxes use the shell spawner, which costs each exec about twice a plain one")
	fl.BoolVar(&f.noWarmPools, "no-warm-pools", false, "keep no warm pool (default: the pools the policy's runtimes.yaml lists for this host's runtime)")
	fl.StringVar(&f.policyDir, "policy-dir", "", "directory with the policy files (default: the built-in policy); the host reads its warm pools from runtimes.yaml")
	fl.StringSliceVar(&f.egressAllowCIDRs, "egress-allow-cidr", nil, "private, loopback or link-local prefix the egress proxies may dial after all, e.g. an internal mirror's 10.1.2.0/24 (repeatable; default: none, only public addresses)")
	fl.StringSliceVar(&f.egressUpstreamCAs, "egress-upstream-ca", nil, "PEM file of a CA the egress proxies trust, besides the system roots, for the upstreams they inject credentials toward (repeatable)")
	fl.IntVar(&cfg.Egress.MaxConns, "egress-max-connections", 0, "concurrent egress connections per sandbox (default 32)")
	fl.Int64Var(&cfg.Egress.MaxBytes, "egress-max-bytes", 0, "egress bytes, up and down, per sandbox over its life (default 1 GiB)")
	fl.IntVar(&cfg.Egress.BytesPerSecond, "egress-bytes-per-second", 0, "egress bandwidth per sandbox, both directions together (default 8 MiB/s)")
	fl.Int64Var(&cfg.MaxImageBytes, "max-image-bytes", 0, "largest image archive, in bytes, the host imports or exports (an environment's built image moving between hosts; default 8 GiB)")
	fl.Float64Var(&f.memPressure, "memory-pressure", 0.05, "memory pressure below this fraction of memory available")
	fl.Float64Var(&f.diskPressure, "disk-pressure", 0.05, "disk pressure below this fraction of the state dir's filesystem free")
	fl.Int64Var(&cfg.Allocatable.CPUMillis, "allocatable-cpu-millis", 0, "CPU offered to sandboxes, in millicores (default: all)")
	fl.Int64Var(&cfg.Allocatable.MemoryBytes, "allocatable-memory-bytes", 0, "memory offered to sandboxes, in bytes (default: all)")
	fl.Int64Var(&cfg.Allocatable.DiskBytes, "allocatable-disk-bytes", 0, "disk offered to sandboxes, in bytes (default: all)")
	fl.StringToStringVar(&cfg.Labels, "label", nil, "label reported to the control plane, key=value (repeatable)")
	fl.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "heartbeat interval until the control plane names one")
	fl.DurationVar(&cfg.ReapInterval, "reap-interval", 5*time.Minute, "how often to look for sandbox containers nothing claims (no record, no placement, or a state dir that is gone)")
	fl.DurationVar(&cfg.ReapGrace, "reap-grace", 10*time.Minute, "age, since creation, at which a sandbox container nothing claims is destroyed")
	return cmd
}

// newHostRuntimes builds a driver for each runtime --runtime names, the
// first the default, and returns what closes them. An unknown or repeated
// runtime, a missing runsc or an unreachable containerd is one clear
// error; nothing falls back to another runtime.
func newHostRuntimes(ctx context.Context, cfg *agent.Config, f hostFlags, log *slog.Logger) (func(), error) {
	// Capacity is accounted with the limits sandboxes get by default.
	cfg.DefaultLimits = containerd.DefaultLimits
	if len(f.runtimes) == 0 {
		return nil, errdefs.InvalidArgument("--runtime names no runtime: want gvisor, runc or process")
	}
	if !slices.Contains(f.runtimes, containerd.RuntimeGVisor) {
		cfg.GVisorPlatform = ""
	}
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	containerds := 0
	for i, rt := range f.runtimes {
		switch rt {
		case containerd.RuntimeGVisor, containerd.RuntimeRunc:
			containerds++
		case process.Name:
		default:
			return nil, errdefs.InvalidArgument("unknown runtime %q: want gvisor, runc or process", rt)
		}
		if slices.Contains(f.runtimes[:i], rt) {
			return nil, errdefs.InvalidArgument("--runtime names %s twice", rt)
		}
	}
	for _, rt := range f.runtimes {
		d, closeDriver, err := newRuntimeDriver(ctx, cfg, f, rt, containerds, log)
		if err != nil {
			closeAll()
			return nil, err
		}
		closers = append(closers, closeDriver)
		cfg.Runtimes = append(cfg.Runtimes, agent.RuntimeDriver{Name: rt, Driver: d})
	}
	return closeAll, nil
}

// newRuntimeDriver builds the driver of one runtime. containerds is how
// many of the host's runtimes containerd runs: each has a state dir of its
// own (its reconciliation removes what in its dir is not its own), gVisor's
// and a lone one's the "containerd" of hosts that ran one runtime.
func newRuntimeDriver(ctx context.Context, cfg *agent.Config, f hostFlags, runtime string, containerds int, log *slog.Logger) (driver.Driver, func(), error) {
	switch runtime {
	case containerd.RuntimeGVisor, containerd.RuntimeRunc:
		dir := "containerd"
		if containerds > 1 && runtime != containerd.RuntimeGVisor {
			dir = "containerd-" + runtime
		}
		c := containerd.Config{
			Address:   f.containerdAddress,
			Runtime:   runtime,
			RunscPath: f.runsc,
			StateDir:  filepath.Join(cfg.StateDir, dir),
			Logger:    cfg.Logger,

			Pull:                f.pullImages,
			PlainHTTPRegistries: f.plainHTTP,
		}
		if runtime == containerd.RuntimeGVisor {
			c.GVisorShim, c.GVisorPlatform, c.Pausable = f.gvisorShim, cfg.GVisorPlatform, f.pausable
			if f.spawnBinarySet {
				// Named: it must be there (Config.Validate says why not).
				abs, err := filepath.Abs(f.spawnBinary)
				if err != nil {
					return nil, nil, fmt.Errorf("--spawn-binary: %w", err)
				}
				c.SpawnBinary = abs
			} else {
				c.SpawnBinary = containerd.FindSpawnBinary(f.spawnBinary, log)
			}
		}
		d, err := containerd.New(ctx, c)
		if err != nil {
			return nil, nil, fmt.Errorf("runtime %s: %w", runtime, err)
		}
		return d, func() { d.Close() }, nil
	case process.Name:
		d, err := process.New(process.Config{Dir: filepath.Join(cfg.StateDir, "process"), AllowUntrusted: f.allowProcess})
		if err != nil {
			if errdefs.KindOf(err) == errdefs.PermissionDeniedKind {
				return nil, nil, fmt.Errorf("%w (pass --allow-untrusted-process-runtime)", err)
			}
			return nil, nil, err
		}
		log.Warn("the process runtime isolates nothing: development only, never for untrusted code")
		return d, func() {}, nil
	}
	return nil, nil, errdefs.InvalidArgument("unknown runtime %q: want gvisor, runc or process", runtime)
}

// firstContainerd is the first of the runtimes' containerd drivers, or
// nil: what the host lists its images with and checks containerd by.
func firstContainerd(rs []agent.RuntimeDriver) *containerd.Driver {
	for _, r := range rs {
		if cd, ok := r.Driver.(*containerd.Driver); ok {
			return cd
		}
	}
	return nil
}

// hostProviders is the provider of each of the host's runtimes, with its
// canary.
func hostProviders(cfg agent.Config, f hostFlags) ([]agent.Provider, error) {
	var out []agent.Provider
	for _, r := range cfg.Runtimes {
		pc := agent.ProviderConfig{Driver: r.Driver, CanaryImage: f.canaryImage}
		switch r.Name {
		case containerd.RuntimeGVisor:
			pc.Binary, pc.Platform, pc.Checkpoint = f.runsc, cfg.GVisorPlatform, f.pausable
		case process.Name:
			pc.CanaryImage = ""
		}
		p, err := agent.NewProvider(r.Name, pc)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// defaultHostID is the host name as a DNS label.
func defaultHostID() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", err
	}
	h = strings.ToLower(strings.SplitN(h, ".", 2)[0])
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, h)
	return strings.Trim(h, "-"), nil
}
