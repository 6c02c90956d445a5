package containerd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

func create(t *testing.T, d *Driver, spec driver.Spec) (driver.Ref, driver.Sandbox) {
	t.Helper()
	ctx := context.Background()
	if spec.Key == "" {
		spec.Key = fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
	}
	if spec.Image == "" {
		spec.Image = busybox
	}
	ref, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Destroy(context.Background(), ref); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	return ref, sb
}

func run(t *testing.T, sb driver.Sandbox, script string) driver.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), driver.ExecRequest{Command: []string{"sh", "-c", script}, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	return res
}

func readInt(t testing.TB, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	var v int64
	if _, err := fmt.Sscan(string(b), &v); err != nil {
		t.Fatalf("%s: %q: %v", path, b, err)
	}
	return v
}

func TestClosedByDefault(t *testing.T) {
	for _, rt := range []string{RuntimeGVisor, RuntimeRunc} {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, Config{Runtime: rt})
			const mem = 256 << 20
			ref, sb := create(t, d, driver.Spec{
				Limits: driver.Limits{CPUMillis: 500, MemoryBytes: mem, Pids: 64},
				Env:    map[string]string{"FOO": "bar"},
			})
			t.Setenv("CORRAL_HOST_ONLY", "secret")

			if got := string(run(t, sb, "id -u; id -g").Stdout); got != "1000\n1000\n" {
				t.Errorf("user inside = %q, want 1000 1000", got)
			}
			var names []string
			for _, kv := range strings.Split(strings.TrimSpace(string(run(t, sb, "env").Stdout)), "\n") {
				k, _, _ := strings.Cut(kv, "=")
				names = append(names, k)
			}
			slices.Sort(names)
			allowed := []string{"FOO", "HOME", "PATH", "PWD", "SHLVL"}
			for _, n := range names {
				if !slices.Contains(allowed, n) {
					t.Errorf("unexpected variable %s in the sandbox (env: %v)", n, names)
				}
			}
			if !slices.Contains(names, "FOO") {
				t.Errorf("Spec.Env FOO missing: %v", names)
			}
			if got := string(run(t, sb, "grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status").Stdout); strings.Count(got, "0000000000000000") != 3 {
				t.Errorf("capabilities inside:\n%s", got)
			}
			writes := run(t, sb, `for p in /etc/x /usr/x /mnt/session/uploads/x /workspace/x /tmp/x /mnt/session/outputs/x; do touch $p 2>/dev/null && echo "$p ok" || echo "$p refused"; done`)
			want := "/etc/x refused\n/usr/x refused\n/mnt/session/uploads/x refused\n/workspace/x ok\n/tmp/x ok\n/mnt/session/outputs/x ok\n"
			if string(writes.Stdout) != want {
				t.Errorf("writes:\n%s\nwant:\n%s", writes.Stdout, want)
			}
			ifaces := run(t, sb, `grep -E '^ *[^ ]+:' /proc/net/dev | cut -d: -f1 | tr -d ' '`)
			for _, i := range strings.Fields(string(ifaces.Stdout)) {
				if i != "lo" {
					t.Errorf("network interface %q in the sandbox; want loopback only", i)
				}
			}
			// The memory limit as the sandbox sees it.
			if rt == RuntimeGVisor {
				got := run(t, sb, `grep MemTotal /proc/meminfo`)
				if !strings.Contains(string(got.Stdout), fmt.Sprintf(" %d kB", mem>>10)) {
					t.Errorf("inside gVisor: %q, want MemTotal %d kB", got.Stdout, mem>>10)
				}
			} else {
				got := run(t, sb, `cat /sys/fs/cgroup/memory/memory.limit_in_bytes`)
				if strings.TrimSpace(string(got.Stdout)) != fmt.Sprint(mem) {
					t.Errorf("inside runc: memory.limit_in_bytes %q, want %d", got.Stdout, mem)
				}
			}
			// And as the host applies it.
			cg := "/sys/fs/cgroup/%s/" + d.cfg.Namespace + "/" + ref.ID + "/%s"
			if v := readInt(t, fmt.Sprintf(cg, "memory", "memory.limit_in_bytes")); v != mem {
				t.Errorf("host memory.limit_in_bytes = %d, want %d", v, mem)
			}
			if v := readInt(t, fmt.Sprintf(cg, "cpu", "cpu.cfs_quota_us")); v != 50000 {
				t.Errorf("host cpu.cfs_quota_us = %d, want 50000 (500 millicores)", v)
			}
			wantPids := int64(64)
			if rt == RuntimeGVisor {
				// The command server and init have spawnHeadroom more
				// (serve.go); a command's own limit is the sandbox's.
				wantPids = 2*(64+spawnHeadroom) + gvisorPidsOverhead
				if got := run(t, sb, `ulimit -u`); strings.TrimSpace(string(got.Stdout)) != "64" {
					t.Errorf("inside gVisor: ulimit -u = %q, want 64", got.Stdout)
				}
			}
			if v := readInt(t, fmt.Sprintf(cg, "pids", "pids.max")); v != wantPids {
				t.Errorf("host pids.max = %d, want %d", v, wantPids)
			}
		})
	}
}

func TestDebianPythonUnderGVisor(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	_, sb := create(t, d, driver.Spec{Image: debian})
	res, err := sb.Exec(context.Background(), driver.ExecRequest{Command: []string{"python3", "-c", "print(6*7)"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "42\n" || res.ExitCode != 0 {
		t.Errorf("python3: %+v (stderr %q)", res, res.Stderr)
	}
}

// killInit kills the sandbox's init and waits until it has exited.
func killInit(t *testing.T, d *Driver, ref driver.Ref) {
	t.Helper()
	ctx := d.ns(context.Background())
	task := taskOf(t, d, ref)
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil {
		t.Fatal(err)
	}
	<-exited
}

func TestAttachRestartsAStoppedInit(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ctx := d.ns(context.Background())
	ref, sb := create(t, d, driver.Spec{})
	if err := sb.WriteFile(ctx, "kept.txt", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The init dies, as after a host reboot.
	killInit(t, d, ref)
	sb2, err := newDriver(t, d.cfg).Attach(ctx, ref)
	if err != nil {
		t.Fatalf("Attach after the init stopped: %v", err)
	}
	if got := run(t, sb2, "cat kept.txt"); string(got.Stdout) != "kept" {
		t.Errorf("workspace after restart: %+v", got)
	}
}

// TestExecRestartsAStoppedInit: when the init of a sandbox already
// attached has stopped (killTree's last resort, an OOM kill), its next
// command starts a new one and runs, in both runtimes, with its input.
func TestExecRestartsAStoppedInit(t *testing.T) {
	for _, rt := range []string{RuntimeGVisor, RuntimeRunc} {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, Config{Runtime: rt})
			ctx := d.ns(context.Background())
			ref, sb := create(t, d, driver.Spec{})
			if err := sb.WriteFile(ctx, "kept.txt", []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			killInit(t, d, ref)
			if got := run(t, sb, "cat kept.txt"); string(got.Stdout) != "kept" {
				t.Errorf("a command after the init stopped: %+v", got)
			}
			killInit(t, d, ref)
			res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"cat"}, Stdin: strings.NewReader("input")})
			if err != nil || string(res.Stdout) != "input" {
				t.Errorf("a command with input after the init stopped: %+v, %v", res, err)
			}
			if got := run(t, sb, "echo again"); string(got.Stdout) != "again\n" {
				t.Errorf("the next command: %+v", got)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	requireRuntime(t)
	ctx := context.Background()
	staleSock := filepath.Join(t.TempDir(), "stale.sock")
	l, err := net.Listen("unix", staleSock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	tests := []struct {
		name string
		cfg  Config
		kind errdefs.Kind
		text string
	}{
		{"unknown runtime", Config{Runtime: "kata"}, errdefs.InvalidArgumentKind, `unknown sandbox runtime "kata"`},
		{"unknown gVisor shim", Config{GVisorShim: "other"}, errdefs.InvalidArgumentKind, `unknown gVisor shim "other"`},
		{"missing runsc", Config{RunscPath: "/nonexistent/runsc"}, errdefs.FailedPreconditionKind, "runsc binary /nonexistent/runsc is missing"},
		{"no containerd socket", Config{Address: "/nonexistent/containerd.sock"}, errdefs.UnavailableKind, "socket /nonexistent/containerd.sock is missing"},
		{"containerd down", Config{Address: staleSock}, errdefs.UnavailableKind, "containerd is not reachable at " + staleSock},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.Address == "" {
				cfg.Address = address()
			}
			cfg.StateDir = t.TempDir()
			_, err := New(ctx, cfg)
			if errdefs.KindOf(err) != tt.kind || !strings.Contains(fmt.Sprint(err), tt.text) {
				t.Errorf("New = %v (kind %v), want kind %v mentioning %q", err, errdefs.KindOf(err), tt.kind, tt.text)
			}
		})
	}
	t.Run("image not present", func(t *testing.T) {
		d := newDriver(t, Config{})
		_, err := d.Create(ctx, driver.Spec{Key: "no-image", Image: "localhost/corral/no-such-image:1"})
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "localhost/corral/no-such-image:1") {
			t.Fatalf("Create = %v, want not found naming the image", err)
		}
		assertNothingLeft(t, d)
	})
	t.Run("command not found", func(t *testing.T) {
		d := newDriver(t, Config{})
		_, sb := create(t, d, driver.Spec{})
		_, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"no-such-tool"}})
		if err == nil || !strings.Contains(err.Error(), "no-such-tool") {
			t.Errorf("Exec = %v, want an error naming the command", err)
		}
	})
}

// assertNothingLeft checks that d has no containers, snapshots or host
// directories.
func assertNothingLeft(t *testing.T, d *Driver) {
	t.Helper()
	ctx := d.ns(context.Background())
	cs, err := d.client.Containers(ctx, d.filter())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		t.Errorf("container %s left behind", c.ID())
	}
	entries, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == spawnersDir {
			continue // the driver's own: the spawner's copies
		}
		t.Errorf("host directory %s left behind", e.Name())
		if _, err := d.client.SnapshotService(d.cfg.Snapshotter).Stat(ctx, e.Name()); err == nil {
			t.Errorf("snapshot %s left behind", e.Name())
		}
	}
}

func TestReconcile(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ctx := d.ns(context.Background())
	ready, _ := create(t, d, driver.Spec{})

	// A create that crashed after making its container, before the task.
	img, err := d.client.GetImage(ctx, busybox)
	if err != nil {
		t.Fatal(err)
	}
	half := newID()
	if err := os.MkdirAll(dirsFor(d.cfg.StateDir, half).workspace, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = d.client.NewContainer(ctx, half,
		client.WithContainerLabels(map[string]string{labelProvider: d.name, labelKey: "half", labelDir: d.cfg.StateDir, labelState: stateCreating}),
		client.WithSnapshotter(d.cfg.Snapshotter),
		client.WithNewSnapshot(half, img),
		client.WithNewSpec(d.specOpts(img, driver.Spec{}, dirsFor(d.cfg.StateDir, half))...))
	if err != nil {
		t.Fatal(err)
	}
	// A destroy that crashed after removing the container.
	stray := newID()
	if err := os.MkdirAll(dirsFor(d.cfg.StateDir, stray).workspace, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Attach(ctx, driver.Ref{Provider: d.name, Key: "half", ID: half}); !errdefs.IsNotFound(err) {
		t.Errorf("Attach to a half-made sandbox = %v, want not found", err)
	}
	if refs, _ := d.List(ctx); len(refs) != 1 || refs[0].ID != ready.ID {
		t.Errorf("List = %+v, want only %s", refs, ready.ID)
	}
	removed, err := newDriver(t, d.cfg).Reconcile(ctx)
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	slices.Sort(removed)
	want := []string{half, stray}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("Reconcile removed %v, want %v", removed, want)
	}
	if _, err := d.client.LoadContainer(ctx, half); err == nil {
		t.Errorf("half-made container %s still there", half)
	}
	if _, err := d.client.SnapshotService(d.cfg.Snapshotter).Stat(ctx, half); err == nil {
		t.Errorf("snapshot of %s still there", half)
	}
	for _, id := range want {
		if _, err := os.Stat(dirsFor(d.cfg.StateDir, id).root); err == nil {
			t.Errorf("host directory of %s still there", id)
		}
	}
	if _, err := d.Attach(ctx, ready); err != nil {
		t.Errorf("the ready sandbox after Reconcile: %v", err)
	}
}

// TestRunscShim runs gVisor through its own shim where the host allows it.
// These machines do not (the shim needs CAP_SYS_RESOURCE to lower its
// oom_score_adj): there Create must fail with that error and leave nothing.
func TestRunscShim(t *testing.T) {
	requireRuntime(t)
	if _, err := os.Stat("/var/cache/corral/bin/containerd-shim-runsc-v1"); err != nil {
		t.Skip("gVisor's shim is not installed (CORRAL_WITH_RUNSC_SHIM=1 scripts/runtime/install.sh)")
	}
	d := newDriver(t, Config{Runtime: RuntimeGVisor, GVisorShim: ShimRunsc})
	ref, err := d.Create(context.Background(), driver.Spec{Key: t.Name(), Image: busybox})
	if err != nil {
		t.Logf("the runsc shim does not run here: %v", err)
		if !strings.Contains(err.Error(), "io.containerd.runsc.v1") {
			t.Errorf("the error does not name the shim: %v", err)
		}
		assertNothingLeft(t, d)
		return
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), ref) })
	sb, err := d.Attach(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if res := run(t, sb, "cat /proc/version"); !strings.Contains(string(res.Stdout), "gvisor") {
		t.Errorf("not gVisor: %q", res.Stdout)
	}
}

// TestTimeoutKillsChildren: a command's children die with it when it times
// out or is cancelled, in both runtimes.
func TestTimeoutKillsChildren(t *testing.T) {
	for _, rt := range []string{RuntimeGVisor, RuntimeRunc} {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, Config{Runtime: rt})
			_, sb := create(t, d, driver.Spec{})
			res, err := sb.Exec(context.Background(), driver.ExecRequest{
				Command: []string{"sh", "-c", "sleep 613 & sleep 614; echo never"},
				Timeout: time.Second,
			})
			if err != nil || !res.TimedOut {
				t.Fatalf("Exec = %+v, %v; want a timeout", res, err)
			}
			ps := run(t, sb, `for d in /proc/[0-9]*; do tr '\0' ' ' < $d/cmdline 2>/dev/null; echo; done`)
			if strings.Contains(string(ps.Stdout), "sleep 61") {
				t.Errorf("children of the timed out command still run:\n%s", ps.Stdout)
			}
		})
	}
}

// TestTimeoutSparesInit: a command that times out after the sandbox's init
// forked anew (here the command kills init's sleep; on a busy host a new
// sandbox's init forks it after the first command started) is killed
// without init's new child, so what an earlier command left running is
// spared: the killer does not fall back to killing the whole sandbox.
func TestTimeoutSparesInit(t *testing.T) {
	for _, rt := range []string{RuntimeGVisor, RuntimeRunc} {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, Config{Runtime: rt})
			_, sb := create(t, d, driver.Spec{})
			run(t, sb, "sleep 700 >/dev/null 2>&1 &")
			res, err := sb.Exec(context.Background(), driver.ExecRequest{
				Command: []string{"sh", "-c", `for d in /proc/[0-9]*; do
  read -r l < $d/stat; set -- ${l##*) }
  [ "${d#/proc/}" != 1 ] && [ "$4" = 1 ] && kill ${d#/proc/}
done
sleep 616`},
				Timeout: time.Second,
			})
			if err != nil || !res.TimedOut {
				t.Fatalf("Exec = %+v, %v; want a timeout", res, err)
			}
			ps := string(run(t, sb, `for d in /proc/[0-9]*; do tr '\0' ' ' < $d/cmdline 2>/dev/null; echo; done`).Stdout)
			if strings.Contains(ps, "sleep 616") {
				t.Errorf("the timed out command still runs:\n%s", ps)
			}
			if !strings.Contains(ps, "sleep 700") {
				t.Errorf("an earlier command's process was killed with the timed out one:\n%s", ps)
			}
		})
	}
}

// TestDiskLimitedWorkspace: with Limits.DiskBytes the workspace is a file
// system of that size, kept across a restart of the sandbox's init (even
// after its mount is gone, as after a host reboot) and removed by Destroy.
func TestDiskLimitedWorkspace(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ctx := d.ns(context.Background())
	ref, sb := create(t, d, driver.Spec{Limits: driver.Limits{DiskBytes: 32 << 20}})
	dirs := dirsFor(d.cfg.StateDir, ref.ID)
	if !mounted(dirs.workspace) {
		t.Fatalf("workspace %s is not a mount", dirs.workspace)
	}
	if list, err := sb.ListFiles(ctx, ""); err != nil || len(list) != 0 {
		t.Errorf("a new workspace lists %+v, %v; want nothing", list, err)
	}
	if res := run(t, sb, "dd if=/dev/zero of=small bs=1M count=8 && echo ok"); string(res.Stdout) != "ok\n" {
		t.Errorf("writing 8 MiB into a 32 MiB workspace: %+v", res)
	}
	res := run(t, sb, "dd if=/dev/zero of=big bs=1M count=64")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("writing 64 MiB into a 32 MiB workspace: exit %d, %q", res.ExitCode, res.Stderr)
	}
	run(t, sb, "rm -f big")
	// The outputs are on the same file system, within the same size: a
	// sandbox cannot fill the host's disk through them either.
	res = run(t, sb, "dd if=/dev/zero of=/mnt/session/outputs/big bs=1M count=64")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("writing 64 MiB into the outputs of a 32 MiB sandbox: exit %d, %q", res.ExitCode, res.Stderr)
	}
	if !mounted(dirs.outputs) {
		t.Errorf("outputs %s is not a mount", dirs.outputs)
	}
	run(t, sb, "rm -f /mnt/session/outputs/big && echo out > /mnt/session/outputs/kept.txt")
	if err := sb.WriteFile(ctx, "kept.txt", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Stop the init and take the mount away, as a reboot would.
	c, err := d.client.LoadContainer(ctx, ref.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.stopTask(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := unmountWorkspace(dirs); err != nil {
		t.Fatal(err)
	}
	sb2, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatalf("Attach after a reboot: %v", err)
	}
	if got := run(t, sb2, "cat kept.txt; df -k /workspace | tail -1"); !strings.HasPrefix(string(got.Stdout), "kept") {
		t.Errorf("workspace after a reboot: %+v", got)
	}
	if got := run(t, sb2, "cat /mnt/session/outputs/kept.txt"); string(got.Stdout) != "out\n" {
		t.Errorf("outputs after a reboot: %+v", got)
	}
	if err := d.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), dirs.root) {
		t.Errorf("a mount under %s is left after Destroy", dirs.root)
	}
	if _, err := os.Stat(dirs.root); err == nil {
		t.Errorf("host directory %s left after Destroy", dirs.root)
	}
}

// A disk-limited workspace still in use when its sandbox is destroyed (a
// snapshot's export reading a file of it) does not stop the Destroy: the
// mount is detached, the host directory removed, and the reader reads on.
func TestDestroyWhileTheWorkspaceIsInUse(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ctx := d.ns(context.Background())
	ref, sb := create(t, d, driver.Spec{Limits: driver.Limits{DiskBytes: 32 << 20}})
	if err := sb.WriteFile(ctx, "open.txt", []byte("still readable"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := dirsFor(d.cfg.StateDir, ref.ID)
	f, err := os.Open(filepath.Join(dirs.workspace, "open.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := d.Destroy(ctx, ref); err != nil {
		t.Fatalf("Destroy with a workspace file open: %v", err)
	}
	if _, err := os.Stat(dirs.root); err == nil {
		t.Errorf("host directory %s left after Destroy", dirs.root)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), dirs.root) {
		t.Errorf("a mount under %s is left after Destroy", dirs.root)
	}
	if b, err := io.ReadAll(f); err != nil || string(b) != "still readable" {
		t.Errorf("the open file after Destroy: %q, %v", b, err)
	}
}

// TestOrphans: a container whose state dir is gone is an orphan to any
// driver of its provider, with its creation time and that dir, and
// DestroyOrphan removes it. Containers of state dirs that exist (another
// agent's, or the driver's own) are neither listed nor removed that way.
func TestOrphans(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	other := newDriver(t, Config{Runtime: RuntimeGVisor})
	goneDir := filepath.Join(t.TempDir(), "state")
	gone := newDriver(t, Config{Runtime: RuntimeGVisor, StateDir: goneDir})
	ctx := context.Background()
	own, _ := create(t, d, driver.Spec{})
	theirs, _ := create(t, other, driver.Spec{})
	before := time.Now()
	orphan, _ := create(t, gone, driver.Spec{})
	after := time.Now()
	if err := os.RemoveAll(goneDir); err != nil {
		t.Fatal(err)
	}
	find := func() map[string]driver.Ref {
		t.Helper()
		refs, err := d.Orphans(ctx)
		if err != nil {
			t.Fatalf("Orphans: %v", err)
		}
		m := map[string]driver.Ref{}
		for _, r := range refs {
			m[r.ID] = r
		}
		return m
	}
	found := find()
	got, ok := found[orphan.ID]
	if !ok {
		t.Fatalf("Orphans = %v, want %s among them", found, orphan.ID)
	}
	if got.Key != orphan.Key || got.Data["state_dir"] != goneDir || got.Created.Before(before.Add(-time.Second)) || got.Created.After(after.Add(time.Second)) {
		t.Errorf("orphan %+v, want key %q, state dir %s and a creation time between %v and %v", got, orphan.Key, goneDir, before, after)
	}
	for _, r := range []driver.Ref{own, theirs} {
		if _, ok := found[r.ID]; ok {
			t.Errorf("Orphans lists %s, whose state dir exists", r.ID)
		}
		if err := d.DestroyOrphan(ctx, r); errdefs.KindOf(err) != errdefs.PermissionDeniedKind {
			t.Errorf("DestroyOrphan(%s), whose state dir exists: %v, want permission denied", r.ID, err)
		}
	}
	if _, err := d.Attach(ctx, own); err != nil {
		t.Errorf("own sandbox after DestroyOrphan: %v", err)
	}
	if _, err := other.Attach(ctx, theirs); err != nil {
		t.Errorf("the other driver's sandbox after DestroyOrphan: %v", err)
	}
	if err := d.DestroyOrphan(ctx, got); err != nil {
		t.Fatalf("DestroyOrphan: %v", err)
	}
	if _, err := d.client.LoadContainer(d.ns(ctx), orphan.ID); err == nil {
		t.Errorf("orphan %s still there", orphan.ID)
	}
	if _, ok := find()[orphan.ID]; ok {
		t.Errorf("Orphans still lists %s after DestroyOrphan", orphan.ID)
	}
	if err := d.DestroyOrphan(ctx, got); err != nil {
		t.Errorf("DestroyOrphan of what is gone: %v", err)
	}
}

// TestTimeoutKillsEscapes: at a command's timeout, whatever it started is
// killed however it hid (a new session without the environment, a fork
// bomb whose processes were reparented), while what an earlier command
// left running is spared; and a fork bomb that returns at once leaves the
// sandbox usable. A pausable sandbox's commands are init's children
// (spawn.go, the compiled spawner here), killed the same way.
func TestTimeoutKillsEscapes(t *testing.T) {
	for _, tt := range []struct {
		name, rt string
		pausable bool
	}{{RuntimeGVisor, RuntimeGVisor, false}, {RuntimeRunc, RuntimeRunc, false}, {"gvisor-pausable", RuntimeGVisor, true}} {
		rt := tt.rt
		t.Run(tt.name, func(t *testing.T) {
			d := newDriver(t, Config{Runtime: rt, Pausable: tt.pausable, Logger: testLogger(t)})
			_, sb := create(t, d, driver.Spec{Limits: driver.Limits{Pids: 64}})
			ctx := context.Background()
			run(t, sb, "sleep 600 >/dev/null 2>&1 &")
			ps := func() string {
				t.Helper()
				return string(run(t, sb, `for d in /proc/[0-9]*; do tr '\0' ' ' < $d/cmdline 2>/dev/null; echo; done`).Stdout)
			}
			for _, script := range []string{
				"env -i setsid sh -c 'sleep 1001 & sleep 1002' >/dev/null 2>&1 & sleep 1003",
				// The shell forks once, before the bomb exists, and then
				// nothing: a fork after the bomb's first child may find
				// every process the sandbox may have already used.
				"(b(){ b | b & }; b) & exec sleep 1004",
			} {
				start := time.Now()
				res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", script}, Timeout: 2 * time.Second})
				if err != nil || !res.TimedOut {
					t.Fatalf("Exec(%q) = %+v, %v; want a timeout", script, res, err)
				}
				t.Logf("%q timed out and was killed in %v", script, time.Since(start))
				if got := ps(); strings.Contains(got, "sleep 10") || strings.Contains(got, "b | b") {
					t.Errorf("after %q timed out, its processes still run:\n%s", script, got)
				}
			}
			if got := ps(); !strings.Contains(got, "sleep 600") {
				t.Errorf("a background process of an earlier command was killed:\n%s", got)
			}
			// A bomb that returns at once: the sandbox is out of processes
			// until something kills them; the next commands must work.
			res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", "b(){ b | b & }; b"}, Timeout: 5 * time.Second})
			t.Logf("a fork bomb that returns at once: exit %d, %v", res.ExitCode, err)
			// Every later command runs, after the bomb is killed if it
			// is in the way.
			for i := range 5 {
				res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", "echo ok"}, Timeout: 10 * time.Second})
				if err != nil || string(res.Stdout) != "ok\n" {
					t.Fatalf("exec %d after a fork bomb: %+v, %v", i, res, err)
				}
				if len(res.Stderr) > 0 {
					t.Logf("exec %d: %s", i, res.Stderr)
				}
			}
		})
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// What runsc exec writes on a command's stderr about its sandbox dying
// under it is replaced by a note; the command's own lines stay.
func TestScrubRuntimeErrors(t *testing.T) {
	s := &sandbox{ref: driver.Ref{ID: "corral-0123456789abcdef"}}
	in := "mine\nwaiting on pid 8: waiting on PID 8 in sandbox \"corral-0123456789abcdef\": urpc method \"containerManager.WaitPID\" failed: EOF\nalso mine\n"
	got := string(s.scrubRuntimeErrors([]byte(in)))
	if got != "mine\n"+runtimeNote+"also mine\n" {
		t.Errorf("scrubbed: %q", got)
	}
	other := "waiting on PID 8 in sandbox \"corral-ffffffffffffffff\": a command's own text\n"
	if got := string(s.scrubRuntimeErrors([]byte(other))); got != other {
		t.Errorf("another sandbox's name was scrubbed: %q", got)
	}
}

// taskOf is the sandbox's containerd task.
func taskOf(t *testing.T, d *Driver, ref driver.Ref) client.Task {
	t.Helper()
	ctx := d.ns(context.Background())
	c, err := d.client.LoadContainer(ctx, ref.ID)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return task
}
