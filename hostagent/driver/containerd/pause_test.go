package containerd

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// counterScript starts a background counter that writes its count to
// /workspace/n ten times a second, and its pid to /workspace/bg.pid.
// (Each value is renamed into place: a pause between the truncate and the
// write of "echo > n" would leave the file empty.)
const counterScript = `sh -c 'i=0; while :; do i=$((i+1)); echo $i > /workspace/n.new; mv /workspace/n.new /workspace/n; sleep 0.1; done' & echo $! > /workspace/bg.pid`

// waitCount waits, inside the sandbox (bounded by the exec timeout), until
// the counter passes min.
func waitCount(t *testing.T, sb driver.Sandbox, min int) {
	t.Helper()
	res := run(t, sb, `i=0; while [ "$(cat /workspace/n 2>/dev/null || echo 0)" -le `+strconv.Itoa(min)+` ]; do i=$((i+1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done`)
	if res.ExitCode != 0 {
		t.Fatalf("the counter did not pass %d within 30s", min)
	}
}

func readCount(t *testing.T, sb driver.Sandbox) int {
	t.Helper()
	b, err := sb.ReadFile(context.Background(), "n", 0)
	if err != nil {
		t.Fatalf("reading the counter: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("counter %q: %v", b, err)
	}
	return n
}

// sandboxProcs counts the host processes of sandbox id: its runsc sandbox,
// gofer and shim.
func sandboxProcs(t *testing.T, id string) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), id) {
			n++
		}
	}
	return n
}

// TestPauseResumeKeepsProcesses: a paused gVisor sandbox holds no host
// process and no memory; resumed, its background process goes on counting
// from where it was, and its files are intact.
func TestPauseResumeKeepsProcesses(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ctx := context.Background()
	ref, sb := create(t, d, driver.Spec{})
	if err := sb.WriteFile(ctx, "notes/a.txt", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := run(t, sb, `echo in-tmp > /tmp/t`); res.ExitCode != 0 {
		t.Fatalf("writing /tmp: %q", res.Stderr)
	}
	if res := run(t, sb, counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: exit %d, %q", res.ExitCode, res.Stderr)
	}
	waitCount(t, sb, 5)
	memDir := "/sys/fs/cgroup/memory/" + d.cfg.Namespace + "/" + ref.ID
	if used := readInt(t, memDir+"/memory.usage_in_bytes"); used < 1<<20 {
		t.Fatalf("a running sandbox's cgroup holds %d bytes; the measure is wrong", used)
	}
	if n := sandboxProcs(t, ref.ID); n == 0 {
		t.Fatal("no host process of the running sandbox found; the measure is wrong")
	}

	if err := d.Pause(ctx, ref); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	paused := readCount(t, sb)
	if n := sandboxProcs(t, ref.ID); n != 0 {
		t.Errorf("%d host processes of the paused sandbox still run", n)
	}
	if _, err := os.Stat(memDir); !errors.Is(err, fs.ErrNotExist) {
		if used := readInt(t, memDir+"/memory.usage_in_bytes"); used > 1<<20 {
			t.Errorf("the paused sandbox's cgroup still holds %d bytes", used)
		}
	}
	if fi, err := os.Stat(checkpointDir(d.cfg.StateDir, ref.ID)); err != nil || !fi.IsDir() {
		t.Fatalf("no checkpoint in the sandbox's state dir: %v", err)
	}
	if b, err := sb.ReadFile(ctx, "notes/a.txt", 0); err != nil || string(b) != "kept" {
		t.Errorf("ReadFile while paused = %q, %v", b, err)
	}
	// A restarted agent's driver sees it paused and leaves it so.
	d2 := newDriver(t, d.cfg)
	if _, err := d2.Attach(ctx, ref); err != nil {
		t.Fatalf("Attach while paused: %v", err)
	}
	if n := sandboxProcs(t, ref.ID); n != 0 {
		t.Errorf("Attach resumed the paused sandbox (%d host processes)", n)
	}

	if err := d2.Resume(ctx, ref); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if _, err := os.Stat(checkpointDir(d.cfg.StateDir, ref.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the checkpoint is still there after Resume: %v", err)
	}
	resumed := readCount(t, sb)
	if resumed < paused {
		t.Fatalf("the counter restarted: %d after resume, %d when paused", resumed, paused)
	}
	waitCount(t, sb, resumed+3)
	if res := run(t, sb, `kill -0 "$(cat /workspace/bg.pid)" && cat /tmp/t`); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "in-tmp" {
		t.Errorf("after resume: the counter's process or /tmp is gone: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if b, err := sb.ReadFile(ctx, "notes/a.txt", 0); err != nil || string(b) != "kept" {
		t.Errorf("ReadFile after resume = %q, %v", b, err)
	}
	t.Logf("counter: %d when paused, %d right after resume", paused, resumed)
}

func TestPauseRefusedWithoutGVisor(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeRunc})
	ref, _ := create(t, d, driver.Spec{})
	if err := d.Pause(context.Background(), ref); errdefs.KindOf(err) != errdefs.UnimplementedKind {
		t.Errorf("Pause under runc = %v, want kind unimplemented", err)
	}
}

// A relayed command whose directory is gone is refused before anything
// runs: runsc checks the relay's working directory (the command's) before
// it starts it, in a sandbox whose init is no spawner (made before its
// host was pausable) as in any other, so the relay's cd never meets a
// missing directory; the relay still ends with cd's status if it did (a
// directory removed between the two), rather than go on into the spawn
// protocol.
func TestRelayedCommandInAMissingDirectory(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	plain := newDriver(t, Config{Runtime: RuntimeGVisor, StateDir: dir})
	ref, _ := create(t, plain, driver.Spec{})
	d := newDriver(t, Config{Runtime: RuntimeGVisor, StateDir: dir, Pausable: true})
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.Exec(ctx, driver.ExecRequest{Command: []string{"sh", "-c", "echo ran >> /workspace/ran"}, Dir: "gone", Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "/workspace/gone") {
		t.Fatalf("Exec in a missing directory: %v, want an error naming it", err)
	}
	if _, err := sb.ReadFile(ctx, "ran", 0); !errdefs.IsNotFound(err) {
		t.Fatalf("the command ran after all (or: %v)", err)
	}
	if res := run(t, sb, "echo ok"); strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("the sandbox after the refused command: %q %q", res.Stdout, res.Stderr)
	}
}
