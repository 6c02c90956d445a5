package containerd

import (
	"context"
	"os"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/hostagent/spawn/spawntest"
)

const (
	busybox = "localhost/corral/busybox:1"
	debian  = "localhost/corral/debian:bookworm-2"
)

// address is the private containerd of scripts/runtime/containerd.sh, or
// CORRAL_CONTAINERD_ADDRESS.
func address() string {
	if a := os.Getenv("CORRAL_CONTAINERD_ADDRESS"); a != "" {
		return a
	}
	return DefaultAddress
}

// requireRuntime skips the test when the machine cannot run sandboxes, and
// fails it instead under CI, where `make test` sets the runtime up.
func requireRuntime(t *testing.T) {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the runtime must be here: "+format, args...)
		}
		t.Skipf(format, args...)
	}
	if os.Geteuid() != 0 {
		skip("containerd sandboxes need root (run `make test` as root: it starts containerd)")
	}
	if p := socketPath(address()); p != "" {
		if _, err := os.Stat(p); err != nil {
			skip("no containerd at %s (scripts/runtime/containerd.sh start): %v", p, err)
		}
	}
}

// newDriver returns a driver over stateDir, closed at cleanup. A gVisor
// driver gets the compiled spawner (Config.SpawnBinary, built once per
// test process) unless cfg names one: newShellDriver keeps an exec per
// command (and the shell scheme, pausable).
func newDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	requireRuntime(t)
	if cfg.Runtime == RuntimeGVisor && cfg.SpawnBinary == "" {
		cfg.SpawnBinary = spawntest.Binary(t)
	}
	return newShellDriver(t, cfg)
}

// newShellDriver is newDriver without the compiled spawner: a pausable
// driver's sandboxes then run their commands through the shell scheme
// (spawn.go), as on a host without the binary.
func newShellDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	requireRuntime(t)
	if cfg.Address == "" {
		cfg.Address = address()
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	sweep(t, cfg)
	d, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.Runtime, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// sweep destroys, when the test ends, every sandbox a driver with cfg holds,
// so that a test failing halfway leaves no sandbox running:
// containerdtest.Sweep, which this package's tests cannot import.
func sweep(tb testing.TB, cfg Config) {
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		d, err := New(ctx, cfg)
		if err != nil {
			tb.Errorf("sweeping %s: %v", cfg.StateDir, err)
			return
		}
		defer d.Close()
		removed, err := d.Reconcile(ctx)
		if err != nil {
			tb.Errorf("sweeping %s: %v", cfg.StateDir, err)
		}
		refs, err := d.List(ctx)
		if err != nil {
			tb.Errorf("sweeping %s: %v", cfg.StateDir, err)
		}
		for _, ref := range refs {
			if err := d.Destroy(ctx, ref); err != nil {
				tb.Errorf("sweeping %s: %v", cfg.StateDir, err)
			}
			removed = append(removed, ref.ID)
		}
		if len(removed) > 0 {
			tb.Logf("swept %d sandboxes left behind in %s: %v", len(removed), cfg.StateDir, removed)
		}
	})
}

func harness(runtime string, pausable bool) drivertest.Factory {
	return harnessWith(runtime, pausable, newDriver)
}

func harnessWith(runtime string, pausable bool, newDriver func(*testing.T, Config) *Driver) drivertest.Factory {
	return func(t *testing.T) drivertest.Harness {
		cfg := Config{Runtime: runtime, StateDir: t.TempDir(), Pausable: pausable}
		d := newDriver(t, cfg)
		return drivertest.Harness{
			Driver: d,
			Reopen: func(t *testing.T) driver.Driver { return newDriver(t, cfg) },
			Image:  busybox,
			// Checkpoints are gVisor's (runc would need CRIU), and
			// only a pausable host's keep a command's processes.
			Pauses: runtime == RuntimeGVisor && pausable,
		}
	}
}

// TestConformanceGVisor: a gVisor host with the compiled spawner, whose
// commands its sandboxes' command servers start (serve.go).
func TestConformanceGVisor(t *testing.T) { drivertest.Run(t, harness(RuntimeGVisor, false)) }

// TestConformanceGVisorExec: the same contract with a runsc exec per
// command, a host's without the compiled spawner.
func TestConformanceGVisorExec(t *testing.T) {
	drivertest.Run(t, harnessWith(RuntimeGVisor, false, newShellDriver))
}

// TestConformanceGVisorPausable: the same contract when every command runs
// under the sandbox's init (spawn.go), the compiled spawner, and Pause and
// Resume work.
func TestConformanceGVisorPausable(t *testing.T) { drivertest.Run(t, harness(RuntimeGVisor, true)) }

// TestConformanceGVisorPausableShell: the same with the shell spawner, a
// host's without the compiled one.
func TestConformanceGVisorPausableShell(t *testing.T) {
	drivertest.Run(t, harnessWith(RuntimeGVisor, true, newShellDriver))
}

func TestConformanceRunc(t *testing.T) { drivertest.Run(t, harness(RuntimeRunc, false)) }
