package devstack

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/tracing"
	"corral.dev/corral/internal/version"
)

// devHostID names the dev stack's host.
const devHostID = "dev"

// pickRuntime is the runtime the dev host runs: the one asked for, else
// gvisor when this process is root and scripts/runtime's runsc and
// containerd are there, else process.
func pickRuntime(asked string, log *slog.Logger) string {
	if asked != "" {
		return asked
	}
	if os.Geteuid() != 0 {
		log.Warn("not running as root: the dev host uses the process runtime")
		return admission.RuntimeProcess
	}
	for _, p := range []string{containerd.DefaultRunscPath, containerd.DefaultAddress} {
		if _, err := os.Stat(p); err != nil {
			log.Warn("the gVisor runtime is not installed (run `make runtime`): the dev host uses the process runtime", "missing", p)
			return admission.RuntimeProcess
		}
	}
	return admission.RuntimeGVisor
}

// devHost is the dev stack's in-process host agent.
type devHost struct {
	agent *agent.Agent
	close func()
}

// startHost builds the dev host agent with the runtime's driver, joined to
// srv with a token srv issues; Run runs it.
func startHost(ctx context.Context, srv *server.Server, runtime, stateDir string, pools []agent.PoolClass, pausable bool, metricsAddr string, otlp tracing.Config, egress agent.EgressConfig, log *slog.Logger) (*devHost, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the host's state dir: %w", err)
	}
	cfg := agent.Config{
		HostID: devHostID, ControlPlane: srv.HostAddr(), StateDir: stateDir, ListenAddr: "127.0.0.1:0",
		Runtime: runtime, Version: version.String(), Logger: log.With("component", "host"),
		DefaultLimits: containerd.DefaultLimits, ReconnectDelay: 200 * time.Millisecond,
		Pools: pools, MetricsAddr: metricsAddr, Tracing: otlp, Egress: egress,
	}
	var (
		d       driver.Driver
		closeFn = func() {}
	)
	switch runtime {
	case admission.RuntimeGVisor, admission.RuntimeRunc:
		cd, err := containerd.New(ctx, containerd.Config{
			Address: containerd.DefaultAddress, Runtime: runtime, GVisorShim: containerd.ShimRunc,
			RunscPath: containerd.DefaultRunscPath, StateDir: filepath.Join(stateDir, "containerd"), Logger: cfg.Logger,
			Pausable: pausable && runtime == admission.RuntimeGVisor,
			// Beside corral, as `corral host` finds it.
			SpawnBinary: spawnBinary(runtime == admission.RuntimeGVisor, log),
		})
		if err != nil {
			return nil, fmt.Errorf("the %s runtime: %w (pass --runtime process to run without isolation)", runtime, err)
		}
		d, closeFn = cd, func() { cd.Close() }
		cfg.GVisorPlatform = "systrap"
	case admission.RuntimeProcess:
		pd, err := process.New(process.Config{Dir: filepath.Join(stateDir, "process"), AllowUntrusted: true})
		if err != nil {
			return nil, err
		}
		d = pd
		log.Warn("SANDBOXES ARE NOT ISOLATED: the dev host runs the process runtime, so every tool call runs on this machine as this user; use gvisor (as root, after `make runtime`) for anything untrusted")
	default:
		return nil, errdefs.InvalidArgument("unknown runtime %q: want gvisor, runc or process", runtime)
	}
	cfg.Driver = d
	var err error
	if cfg.Capacity, err = agent.HostResources(stateDir); err != nil {
		closeFn()
		return nil, err
	}
	cfg.Usage = agent.HostUsage(stateDir)
	// Pressure as `corral host` judges it by default: under 5% of memory
	// available (idle sandboxes are paused, where they can be, then
	// evicted) or of the state dir's disk free (evicted).
	cfg.Pressure = agent.HostPressure(stateDir, 0.05, 0.05)
	tok, err := srv.Hosts().IssueToken(ctx, 10*time.Minute)
	if err != nil {
		closeFn()
		return nil, fmt.Errorf("issuing the dev host's join token: %w", err)
	}
	cfg.JoinToken = logging.Secret(tok.Reveal())
	a, err := agent.New(ctx, cfg)
	if err != nil {
		closeFn()
		return nil, err
	}
	return &devHost{agent: a, close: func() { a.Close(); closeFn() }}, nil
}

// spawnBinary is the compiled spawner of a gVisor dev host: beside
// corral's executable, or none (the shell spawner, commands as execs of
// their own), said once in the log.
func spawnBinary(gvisor bool, log *slog.Logger) string {
	if !gvisor {
		return ""
	}
	return containerd.FindSpawnBinary(containerd.SpawnBinaryBeside(), log)
}
