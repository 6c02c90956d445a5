package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/internal/capture"
	"corral.dev/corral/hostagent/spawn"
	"corral.dev/corral/internal/errdefs"
)

// Runtime names.
const (
	RuntimeGVisor = "gvisor"
	RuntimeRunc   = "runc"
)

// gVisor shims.
const (
	// ShimRunc runs runsc through containerd's runc shim (BinaryName).
	ShimRunc = "runc"
	// ShimRunsc is gVisor's own shim, io.containerd.runsc.v1.
	ShimRunsc = "runsc"
)

// Defaults.
const (
	DefaultAddress     = "/var/lib/corral/containerd/containerd.sock"
	DefaultNamespace   = "corral"
	DefaultRunscPath   = "/var/cache/corral/bin/runsc"
	DefaultStateDir    = "/var/lib/corral/sandboxes"
	DefaultSnapshotter = "overlayfs"
	DefaultTmpBytes    = 64 << 20 // bytes of the /tmp tmpfs
	// SandboxUID and SandboxGID are the user inside every sandbox.
	SandboxUID = 1000
	SandboxGID = 1000
)

// DefaultLimits apply to zero fields of Spec.Limits and Config.Limits.
var DefaultLimits = driver.Limits{
	CPUMillis:   1000,
	MemoryBytes: 512 << 20,
	Pids:        256,
}

// Config configures the containerd driver. Zero fields take the defaults
// above.
type Config struct {
	// Address is containerd's socket.
	Address string
	// Namespace is the containerd namespace holding corral's containers.
	Namespace string
	// Runtime is "gvisor" or "runc".
	Runtime string
	// GVisorShim is "runc" (runsc through the runc shim) or "runsc"
	// (gVisor's shim). Only for Runtime gvisor.
	GVisorShim string
	// Pausable makes the host's gVisor sandboxes pausable: every command
	// then runs as a child of the sandbox's init (spawn.go), because
	// gVisor's restore kills every process a runsc exec started, with its
	// descendants, and a pause must keep what a command left running.
	// With SpawnBinary that costs nothing a command (the command server
	// hands it to init); with the shell scheme about twice a plain runsc
	// exec. Without it Pause and Resume are Unimplemented.
	Pausable bool
	// SpawnBinary is the host path of cmd/corral-spawn, the compiled
	// spawner (spawn.go, serve.go): when set, every new gVisor sandbox
	// gets it bind-mounted read-only and runs its commands through a
	// command server it keeps, with no runsc exec per command (a pausable
	// one's under its init), instead of an exec each (and, pausable, the
	// shell scheme's nine processes). Sandboxes keep the scheme they were
	// made with. The driver mounts a copy of it, kept under
	// StateDir/spawners per build, so that replacing the file (an
	// upgrade) leaves paused sandboxes their own build. Empty: an exec
	// per command, and the shell scheme when pausable.
	SpawnBinary string
	// RunscPath is the runsc binary the runc shim runs.
	RunscPath string
	// GVisorPlatform is runsc's --platform: "" or "systrap" (runsc's
	// default), "ptrace", or "kvm" (which needs /dev/kvm usable). Only
	// with the runc shim (platform.go).
	GVisorPlatform string
	// StateDir holds each sandbox's host directories (workspace, uploads,
	// outputs). The driver manages only containers it labelled with this
	// directory.
	StateDir string
	// Snapshotter is the containerd snapshotter.
	Snapshotter string
	// Limits are the defaults for sandboxes whose Spec sets none.
	Limits driver.Limits
	// TmpBytes sizes the /tmp tmpfs (bytes).
	TmpBytes int64
	// Pull fetches an image that is not present from its registry. Off by
	// default: without a registry, images are imported (scripts/runtime).
	Pull bool
	// PlainHTTPRegistries are registry hosts (host:port) reached over plain
	// HTTP instead of HTTPS, such as a registry on the host's loopback.
	PlainHTTPRegistries []string
	// PullTimeout bounds one pull. Default 10 minutes.
	PullTimeout time.Duration
	// Logger receives the driver's logs.
	Logger *slog.Logger

	// specHook, if set, edits every container spec last. Tests use it to
	// build a deliberately open configuration for the isolation probes.
	specHook specHook
}

func (c *Config) setDefaults() {
	if c.Address == "" {
		c.Address = DefaultAddress
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Runtime == "" {
		c.Runtime = RuntimeGVisor
	}
	if c.GVisorShim == "" {
		c.GVisorShim = ShimRunc
	}
	if c.RunscPath == "" {
		c.RunscPath = DefaultRunscPath
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.Snapshotter == "" {
		c.Snapshotter = DefaultSnapshotter
	}
	if c.TmpBytes == 0 {
		c.TmpBytes = DefaultTmpBytes
	}
	if c.PullTimeout == 0 {
		c.PullTimeout = 10 * time.Minute
	}
	c.Limits = withDefaults(c.Limits, DefaultLimits)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func withDefaults(l, d driver.Limits) driver.Limits {
	if l.CPUMillis == 0 {
		l.CPUMillis = d.CPUMillis
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = d.DiskBytes
	}
	return l
}

// Validate checks the configuration without contacting containerd: one
// clear error per mistake.
func (c *Config) Validate() error {
	switch c.Runtime {
	case RuntimeGVisor, RuntimeRunc:
	default:
		return errdefs.InvalidArgument("unknown sandbox runtime %q: want %q or %q", c.Runtime, RuntimeGVisor, RuntimeRunc)
	}
	if c.Runtime == RuntimeGVisor {
		switch c.GVisorShim {
		case ShimRunc:
			fi, err := os.Stat(c.RunscPath)
			if err != nil {
				return errdefs.Wrap(errdefs.FailedPreconditionKind, err, "gVisor runtime: runsc binary %s is missing (scripts/runtime/install.sh builds it)", c.RunscPath)
			}
			if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
				return errdefs.FailedPrecondition("gVisor runtime: %s is not an executable file", c.RunscPath)
			}
		case ShimRunsc:
		default:
			return errdefs.InvalidArgument("unknown gVisor shim %q: want %q or %q", c.GVisorShim, ShimRunc, ShimRunsc)
		}
		switch c.GVisorPlatform {
		case "", PlatformSystrap:
		case PlatformPtrace, PlatformKVM:
			if c.GVisorShim != ShimRunc {
				return errdefs.InvalidArgument("gVisor platform %s needs the runc shim (GVisorShim %q)", c.GVisorPlatform, ShimRunc)
			}
		default:
			return errdefs.InvalidArgument("unknown gVisor platform %q: want %s, %s or %s", c.GVisorPlatform, PlatformSystrap, PlatformPtrace, PlatformKVM)
		}
	} else if c.GVisorPlatform != "" {
		return errdefs.InvalidArgument("a gVisor platform is for the gvisor runtime, not %s", c.Runtime)
	}
	if c.SpawnBinary != "" {
		if !filepath.IsAbs(c.SpawnBinary) {
			return errdefs.InvalidArgument("SpawnBinary %q must be absolute", c.SpawnBinary)
		}
		fi, err := os.Stat(c.SpawnBinary)
		if err != nil {
			return errdefs.Wrap(errdefs.FailedPreconditionKind, err, "the spawner binary %s is missing (make build builds bin/corral-spawn)", c.SpawnBinary)
		}
		if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			return errdefs.FailedPrecondition("the spawner binary %s is not an executable file", c.SpawnBinary)
		}
	}
	if !filepath.IsAbs(c.StateDir) {
		return errdefs.InvalidArgument("StateDir %q must be absolute", c.StateDir)
	}
	if l := c.Limits; l.CPUMillis < 0 || l.MemoryBytes < 0 || l.Pids < 0 || l.DiskBytes < 0 || c.TmpBytes < 0 {
		return errdefs.InvalidArgument("limits must not be negative: %+v", l)
	}
	return nil
}

// Name is the provider name of a runtime.
func providerName(runtime string) string { return "containerd-" + runtime }

// socketPath returns the unix socket path of an address, or "".
func socketPath(addr string) string {
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		return p
	}
	if strings.HasPrefix(addr, "/") {
		return addr
	}
	return ""
}

func (c *Config) String() string {
	return fmt.Sprintf("containerd %s ns=%s runtime=%s", c.Address, c.Namespace, c.Runtime)
}

// SpawnBinaryBeside is where a host looks for the compiled spawner by
// default: corral-spawn beside its own executable (make build puts both in
// bin/), or "" if the executable cannot be found.
func SpawnBinaryBeside() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "corral-spawn")
}

// FindSpawnBinary returns path, made absolute, for Config.SpawnBinary if it
// is an executable file, else "" (the shell spawner) after one warning on
// log saying why.
func FindSpawnBinary(path string, log *slog.Logger) string {
	if path == "" {
		log.Warn("no spawner binary named: every command is an exec of its own (no command server, ~20 ms more each) and pausable sandboxes use the shell spawner, about twice a plain exec per command")
		return ""
	}
	abs, err := filepath.Abs(path)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(abs); err == nil && (!fi.Mode().IsRegular() || fi.Mode()&0o111 == 0) {
			err = errors.New("not an executable file")
		}
	}
	if err != nil {
		log.Warn("the spawner binary is missing: every command is an exec of its own (no command server, ~20 ms more each) and pausable sandboxes use the shell spawner, about twice a plain exec per command (make build builds bin/corral-spawn)", "path", path, "err", err)
		return ""
	}
	if err := checkSpawner(abs); err != nil {
		log.Warn("the spawner binary is not this build's: every command is an exec of its own (no command server, ~20 ms more each) and pausable sandboxes use the shell spawner, about twice a plain exec per command", "path", abs, "err", err)
		return ""
	}
	return abs
}

// checkSpawner runs `path version` and refuses a spawner that speaks other
// versions of its interfaces than this build (spawn.Interface): every
// command of its sandboxes would fail.
func checkSpawner(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := capture.New(256, nil) // its answer is a line
	cmd := exec.CommandContext(ctx, path, "version")
	cmd.Stdout = out
	if err := cmd.Run(); err != nil {
		return errdefs.Wrap(errdefs.FailedPreconditionKind, err, "the spawner binary %s: running its version", path)
	}
	if got, want := string(bytes.TrimSpace(out.Bytes())), spawn.Interface(); got != want {
		return errdefs.FailedPrecondition("the spawner binary %s speaks %q, this host %q: install the corral-spawn of this build beside it (make build)", path, got, want)
	}
	return nil
}
