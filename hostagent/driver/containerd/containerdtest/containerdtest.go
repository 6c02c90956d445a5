// Package containerdtest finds the sandbox runtime for tests outside the
// containerd driver: the private containerd that scripts/runtime starts, and
// runsc. On a machine without them a test skips and says why; under CI,
// where `make test` sets them up, it fails instead, so a green CI always ran
// the real suites. Sweep removes, when a test ends, every sandbox a driver
// made, so no test leaves a gVisor sandbox running.
package containerdtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cerrdefs "github.com/containerd/errdefs"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/spawn/spawntest"
)

// Address returns the containerd address tests use (CORRAL_CONTAINERD_ADDRESS,
// or the private containerd's), once it has checked that this machine can
// run gVisor sandboxes through it: root, the socket, runsc.
func Address(tb testing.TB) string {
	tb.Helper()
	skip := func(format string, args ...any) {
		tb.Helper()
		if os.Getenv("CI") != "" {
			tb.Fatalf("CI is set, so the gVisor runtime must be here: "+format, args...)
		}
		tb.Skipf(format, args...)
	}
	if os.Geteuid() != 0 {
		skip("gVisor sandboxes through containerd need root (run `make test` as root: it starts containerd)")
	}
	addr := os.Getenv("CORRAL_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = containerd.DefaultAddress
	}
	if p := strings.TrimPrefix(addr, "unix://"); strings.HasPrefix(p, "/") {
		if _, err := os.Stat(p); err != nil {
			skip("no containerd at %s (scripts/runtime/containerd.sh start): %v", p, err)
		}
		// A socket left by a containerd that died answers nothing: say so
		// here, not as a host agent failing to start.
		conn, err := net.DialTimeout("unix", p, 5*time.Second)
		if err != nil {
			skip("containerd at %s does not answer (scripts/runtime/containerd.sh start): %v", p, err)
		}
		conn.Close()
	}
	if _, err := os.Stat(containerd.DefaultRunscPath); err != nil {
		skip("no runsc at %s (make runtime): %v", containerd.DefaultRunscPath, err)
	}
	return addr
}

// NewDriver returns a containerd driver for a test, on Address(tb) unless
// cfg names one and in a fresh temporary state dir unless cfg names one. A
// gVisor driver gets the compiled spawner (Config.SpawnBinary, built once
// per test process) unless cfg names one. At cleanup it is
// closed and then swept (Sweep): create it before whatever uses it (a host
// agent), so that those stop first.
func NewDriver(tb testing.TB, cfg containerd.Config) *containerd.Driver {
	tb.Helper()
	if cfg.Address == "" {
		cfg.Address = Address(tb)
	}
	if (cfg.Runtime == "" || cfg.Runtime == containerd.RuntimeGVisor) && cfg.SpawnBinary == "" {
		cfg.SpawnBinary = spawntest.Binary(tb)
	}
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	Sweep(tb, cfg)
	d, err := containerd.New(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

// Sweep registers a cleanup that destroys every sandbox a containerd driver
// with cfg's address, runtime and state dir holds, ready or half made: the
// backstop for a test whose host agent is dead, or not done destroying, when
// it ends. Cleanups run last registered first, so register it before
// starting what makes the sandboxes. cfg.StateDir is required: the sweep
// must never reach sandboxes outside the test's own directory. A sandbox it
// removes is logged; one it cannot remove fails the test.
func Sweep(tb testing.TB, cfg containerd.Config) {
	tb.Helper()
	if cfg.StateDir == "" {
		tb.Fatal("containerdtest.Sweep: a state dir is required")
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		d, err := containerd.New(ctx, cfg)
		if err != nil {
			tb.Errorf("sweeping the sandboxes in %s: %v", cfg.StateDir, err)
			return
		}
		defer d.Close()
		removed, err := d.Reconcile(ctx) // half-made ones
		if err != nil {
			tb.Errorf("sweeping the sandboxes in %s: %v", cfg.StateDir, err)
		}
		refs, err := d.List(ctx) // ready ones
		if err != nil {
			tb.Errorf("sweeping the sandboxes in %s: %v", cfg.StateDir, err)
		}
		for _, ref := range refs {
			if err := d.Destroy(ctx, ref); err != nil {
				tb.Errorf("sweeping the sandboxes in %s: %v", cfg.StateDir, err)
				continue
			}
			removed = append(removed, ref.ID+" ("+ref.Key+")")
		}
		if len(removed) > 0 {
			tb.Logf("swept %d sandboxes left behind in %s: %v", len(removed), cfg.StateDir, removed)
		}
	})
}

// RemoveBuiltImages removes, when the test ends, the images whose names
// images returns then that a build made on cfg's containerd (the images
// of environment builds are kept by the host, and each test run's have
// new names: its mirrors' ports are in their keys).
func RemoveBuiltImages(tb testing.TB, cfg containerd.Config, images func() []string) {
	tb.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d, err := containerd.New(ctx, cfg)
		if err != nil {
			tb.Errorf("removing built images: %v", err)
			return
		}
		defer d.Close()
		for _, name := range images() {
			if err := d.RemoveImage(ctx, name); err != nil {
				tb.Errorf("removing built image %s: %v", name, err)
			}
		}
	})
}

// TempNamespace returns a containerd namespace of the test's own, empty:
// a host agent's driver in it sees none of the images the shared
// namespace holds (a test of moving images between hosts gives its second
// host one). At cleanup its images are removed, then the namespace.
// Sweep the sandboxes of drivers in it first (NewDriver does).
func TempNamespace(tb testing.TB) string {
	tb.Helper()
	addr := Address(tb)
	name := "corraltest-" + strings.ToLower(rand.Text()[:10])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := client.New(strings.TrimPrefix(addr, "unix://"))
		if err != nil {
			tb.Errorf("removing namespace %s: %v", name, err)
			return
		}
		defer c.Close()
		nctx := namespaces.WithNamespace(ctx, name)
		imgs, err := c.ImageService().List(nctx)
		if err != nil {
			tb.Errorf("removing namespace %s: %v", name, err)
			return
		}
		for _, img := range imgs {
			if err := c.ImageService().Delete(nctx, img.Name, images.SynchronousDelete()); err != nil {
				tb.Errorf("removing image %s of namespace %s: %v", img.Name, name, err)
			}
		}
		if err := c.NamespaceService().Delete(ctx, name); err != nil && !cerrdefs.IsNotFound(err) {
			tb.Logf("namespace %s is left (%v): containerd keeps a namespace that still holds content or snapshots until its GC runs", name, err)
		}
	})
	return name
}

// RawExec runs argv in sandbox id's task as a runsc exec through
// containerd, the sandbox's own exec (what the driver did for every
// command before its command server): the baseline of the benchmarks that
// measure corral's tool path against the sandbox.
func RawExec(ctx context.Context, d *containerd.Driver, id string, argv ...string) error {
	ctx = namespaces.WithNamespace(ctx, d.Namespace())
	c, err := d.Client().LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return err
	}
	spec, err := task.Spec(ctx)
	if err != nil {
		return err
	}
	proc := *spec.Process
	proc.Args = argv
	// With its output read, as a command's must be.
	p, err := task.Exec(ctx, "raw-"+strings.ToLower(rand.Text()[:12]), &proc, cio.NewCreator(cio.WithStreams(nil, io.Discard, io.Discard)))
	if err != nil {
		return err
	}
	defer func() { _, _ = p.Delete(context.WithoutCancel(ctx), client.WithProcessKill) }()
	exited, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	st := <-exited
	p.IO().Wait()
	if code := st.ExitCode(); st.Error() == nil && code != 0 {
		return fmt.Errorf("%q exited %d", argv, code)
	}
	return st.Error()
}
