package containerd

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/spawn"
	"corral.dev/corral/internal/errdefs"
)

// initArgsOf is the init argv of a sandbox's spec.
func initArgsOf(t *testing.T, d *Driver, ref driver.Ref) []string {
	t.Helper()
	_, info, err := d.load(d.ns(context.Background()), ref.ID)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := (&sandbox{d: d, ref: ref}).baseProcess(info)
	if err != nil {
		t.Fatal(err)
	}
	return proc.Args
}

// TestCompiledSpawner: a pausable sandbox made with the compiled spawner
// has it as its init; its commands run as init's children, each in a
// session of its own, with the sandbox's process limit, soft and hard.
func TestCompiledSpawner(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ref, sb := create(t, d, driver.Spec{Limits: driver.Limits{Pids: 100}})
	if sp := spawnerOf(initArgsOf(t, d, ref)); sp != compiledSpawner {
		t.Fatalf("the sandbox's init %q is not the compiled spawner", initArgsOf(t, d, ref))
	}
	res := run(t, sb, `set -- $(sed 's/.*) //' /proc/$$/stat); echo "$2 $4"; echo $$; grep processes /proc/self/limits | tr -s ' ' | cut -d' ' -f3,4`)
	lines := strings.Fields(string(res.Stdout))
	if len(lines) != 5 || lines[0] != "1" || lines[1] != lines[2] || lines[3] != "100" || lines[4] != "100" {
		t.Errorf("parent, session, pid, limits = %q, want 1, its own pid twice, 100 100 (stderr %q)", lines, res.Stderr)
	}
	if res := run(t, sb, `touch /.corral-spawn 2>/dev/null && echo writable; cat /.corral-spawn > /tmp/copy && chmod +x /tmp/copy && echo copied`); strings.Contains(string(res.Stdout), "writable") {
		t.Errorf("the spawner's binary is writable from the sandbox: %q", res.Stdout)
	}
}

// TestShellSandboxOnACompiledHost: a sandbox made by a pausable host
// without the compiled spawner keeps the shell scheme when a host with it
// takes it over: its commands run, its background process survives a
// pause and resume, and the new host's new sandboxes get the compiled one.
func TestShellSandboxOnACompiledHost(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	old := newShellDriver(t, Config{Runtime: RuntimeGVisor, StateDir: dir, Pausable: true})
	ref, _ := create(t, old, driver.Spec{})
	d := newDriver(t, Config{Runtime: RuntimeGVisor, StateDir: dir, Pausable: true})
	if d.cfg.SpawnBinary == "" {
		t.Fatal("the new driver has no spawner binary")
	}
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if sp := spawnerOf(initArgsOf(t, d, ref)); sp != shellSpawner {
		t.Fatalf("the old sandbox's init %q is not the shell spawner", initArgsOf(t, d, ref))
	}
	if res := run(t, sb, counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: exit %d, %q", res.ExitCode, res.Stderr)
	}
	waitCount(t, sb, 3)
	if err := d.Pause(ctx, ref); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	paused := readCount(t, sb)
	if err := d.Resume(ctx, ref); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	waitCount(t, sb, paused+3)
	if res := run(t, sb, `kill -0 "$(cat /workspace/bg.pid)" && test ! -e /.corral-spawn && echo ok`); strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("after resume, the counter or the scheme: %q %q", res.Stdout, res.Stderr)
	}
	ref2, _ := create(t, d, driver.Spec{})
	if sp := spawnerOf(initArgsOf(t, d, ref2)); sp != compiledSpawner {
		t.Errorf("a new sandbox's init %q is not the compiled spawner", initArgsOf(t, d, ref2))
	}
}

// TestCompiledCheckpointMovesToAnotherBinaryPath: a sandbox with the
// compiled spawner moves live to a host whose binary is elsewhere (a copy
// of it): the mount's source is not part of what runsc's restore
// compares. Its background process goes on, and the new host's relays run
// its commands.
func TestCompiledCheckpointMovesToAnotherBinaryPath(t *testing.T) {
	a := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	bin, err := os.ReadFile(a.cfg.SpawnBinary)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "elsewhere", "corral-spawn")
	if err := os.MkdirAll(filepath.Dir(other), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	b := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true, SpawnBinary: other})
	ctx := context.Background()
	refA, sbA := create(t, a, driver.Spec{Key: "s1"})
	if res := run(t, sbA, `echo in-tmp > /tmp/t && `+counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: exit %d, %q", res.ExitCode, res.Stderr)
	}
	waitCount(t, sbA, 3)
	if err := a.Pause(ctx, refA); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	paused := readCount(t, sbA)
	var image bytes.Buffer
	if _, err := a.ExportCheckpoint(ctx, refA, &image); err != nil {
		t.Fatalf("ExportCheckpoint: %v", err)
	}
	refB, sbB := create(t, b, driver.Spec{Key: "s1"})
	copyWorkspace(t, sbA, sbB)
	if err := b.RestoreCheckpoint(ctx, refB, bytes.NewReader(image.Bytes()), driver.CheckpointLimits{}); err != nil {
		t.Fatalf("RestoreCheckpoint: %v", err)
	}
	waitCount(t, sbB, paused+3)
	if res := run(t, sbB, `kill -0 "$(cat /workspace/bg.pid)" && cat /tmp/t`); strings.TrimSpace(string(res.Stdout)) != "in-tmp" {
		t.Errorf("after the move: %q %q", res.Stdout, res.Stderr)
	}
}

// FindSpawnBinary takes an executable file, made absolute, and for anything
// else warns once and falls back to the shell spawner.
func TestFindSpawnBinary(t *testing.T) {
	dir := t.TempDir()
	exe, plain, other := filepath.Join(dir, "corral-spawn"), filepath.Join(dir, "plain"), filepath.Join(dir, "other-build")
	// What a spawner of this build says to `version`, and one of another.
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n[ \"$1\" = version ] && echo '"+spawn.Interface()+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte("#!/bin/sh\necho 'corral-spawn init 1, relay 0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, tt := range []struct{ path, want string }{
		{exe, exe},
		{"corral-spawn", exe},
		{"", ""},
		{filepath.Join(dir, "missing"), ""},
		{plain, ""},
		{dir, ""},
		{other, ""},
	} {
		var logs bytes.Buffer
		got := FindSpawnBinary(tt.path, slog.New(slog.NewTextHandler(&logs, nil)))
		warnings := strings.Count(logs.String(), "level=WARN")
		if got != tt.want || (tt.want == "") != (warnings == 1) || warnings > 1 {
			t.Errorf("FindSpawnBinary(%q) = %q with %d warnings; want %q", tt.path, got, warnings, tt.want)
		}
	}
	// A driver given another build's spawner directly refuses to start.
	if err := checkSpawner(other); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), spawn.Interface()) {
		t.Errorf("checkSpawner of another build: %v, want failed precondition naming this build's %q", err, spawn.Interface())
	}
	if _, err := installSpawner(Config{Runtime: RuntimeGVisor, Pausable: true, SpawnBinary: other, StateDir: t.TempDir()}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("installing another build's spawner: %v, want failed precondition", err)
	}
}

// TestCompiledSpawnerReplacedWhilePaused: the host's binary is replaced by
// another build (an upgrade) while a sandbox is paused. Resumed over the
// copy of the build it was made with (installSpawner: over the new build
// gVisor's restore brought back an init that died), its background
// process goes on and its commands run; a new sandbox gets the new build.
func TestCompiledSpawnerReplacedWhilePaused(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "corral-spawn")
	build := func(out string, flags ...string) {
		t.Helper()
		cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", out, "corral.dev/corral/cmd/corral-spawn")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
	}
	// A build of its own (-s: no other test builds it so), since a build
	// that another test's sandboxes mount is kept for them.
	build(bin, "-ldflags=-s")
	d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true, SpawnBinary: bin})
	ctx := context.Background()
	ref, sb := create(t, d, driver.Spec{})
	if res := run(t, sb, counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: exit %d, %q", res.ExitCode, res.Stderr)
	}
	waitCount(t, sb, 3)
	if err := d.Pause(ctx, ref); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	paused := readCount(t, sb)
	// Another build, of another layout, renamed into place.
	build(bin+".new", "-trimpath", "-ldflags=-s -w")
	old, _ := os.ReadFile(bin)
	upgraded, _ := os.ReadFile(bin + ".new")
	if bytes.Equal(old, upgraded) {
		t.Fatal("the two builds are the same binary; the test proves nothing")
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctx, ref); err != nil {
		t.Fatalf("Resume after the binary changed: %v", err)
	}
	waitCount(t, sb, paused+3)
	for i := range 3 {
		if res := run(t, sb, `kill -0 "$(cat /workspace/bg.pid)" && echo ok`); strings.TrimSpace(string(res.Stdout)) != "ok" {
			t.Errorf("command %d after the upgrade: %q %q", i, res.Stdout, res.Stderr)
		}
	}
	// A copy of a build no sandbox mounts (one whose sandboxes are all
	// gone) goes when the driver next starts; the old build stays while
	// the sandbox made with it does.
	stale := filepath.Join(filepath.Dir(filepath.Dir(d.spawnSource)), "0123456789abcdef0123456789abcdef")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "corral-spawn"), old, 0o755); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, d.cfg)
	if d2.spawnSource == d.spawnSource || filepath.Dir(filepath.Dir(d2.spawnSource)) != filepath.Dir(filepath.Dir(d.spawnSource)) {
		t.Errorf("the new build's copy is %s, the old one's %s", d2.spawnSource, d.spawnSource)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the copy of a build no sandbox mounts is still there: %v", err)
	}
	if _, err := os.Stat(d.spawnSource); err != nil {
		t.Errorf("the old build's copy, which a sandbox mounts, is gone: %v", err)
	}
	_, sb2 := create(t, d2, driver.Spec{})
	if res := run(t, sb2, "echo ok"); strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("a sandbox of the new build: %q %q", res.Stdout, res.Stderr)
	}
	if err := d2.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	d3 := newDriver(t, d.cfg)
	if _, err := os.Stat(filepath.Dir(d.spawnSource)); !os.IsNotExist(err) {
		t.Errorf("the old build's copy is still there after its last sandbox went: %v", err)
	}
	if d3.spawnSource != d2.spawnSource {
		t.Errorf("the build's copy moved from %s to %s", d2.spawnSource, d3.spawnSource)
	}
	if res := run(t, sb2, "echo ok"); strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("the new build's sandbox after the old build's copy went: %q %q", res.Stdout, res.Stderr)
	}
}

// TestCompiledCheckpointRefusedByAnotherBuild: a checkpoint taken in a
// sandbox of one spawner build does not restore over another build's (a
// live move to a host upgraded meanwhile): runsc would take it, and the
// restored init would stop serving, killing the commands' background
// processes. RestoreCheckpoint refuses it before it touches the target
// sandbox, whose init goes on serving commands (the caller moves the
// workspace alone), and one from a shell-spawner sandbox too.
func TestCompiledCheckpointRefusedByAnotherBuild(t *testing.T) {
	a := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	other := filepath.Join(t.TempDir(), "corral-spawn")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", other, "corral.dev/corral/cmd/corral-spawn")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	b := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true, SpawnBinary: other})
	if a.spawnSource == "" || filepath.Base(filepath.Dir(a.spawnSource)) == filepath.Base(filepath.Dir(b.spawnSource)) {
		t.Fatalf("the two hosts' spawner copies %s and %s are of one build; the test proves nothing", a.spawnSource, b.spawnSource)
	}
	shell := newShellDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true})
	ctx := context.Background()
	for name, from := range map[string]*Driver{"another build": a, "the shell spawner": shell} {
		refA, sbA := create(t, from, driver.Spec{Key: "from"})
		if res := run(t, sbA, counterScript); res.ExitCode != 0 {
			t.Fatalf("%s: starting the counter: exit %d, %q", name, res.ExitCode, res.Stderr)
		}
		if err := from.Pause(ctx, refA); err != nil {
			t.Fatalf("%s: Pause: %v", name, err)
		}
		var image bytes.Buffer
		if _, err := from.ExportCheckpoint(ctx, refA, &image); err != nil {
			t.Fatalf("%s: ExportCheckpoint: %v", name, err)
		}
		refB, sbB := create(t, b, driver.Spec{Key: "to-" + strings.ReplaceAll(name, " ", "-")})
		copyWorkspace(t, sbA, sbB)
		err := b.RestoreCheckpoint(ctx, refB, bytes.NewReader(image.Bytes()), driver.CheckpointLimits{})
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "spawner build") {
			t.Fatalf("%s: RestoreCheckpoint over another build: %v, want a refusal naming the spawner builds", name, err)
		}
		if res := run(t, sbB, "echo still-serving"); strings.TrimSpace(string(res.Stdout)) != "still-serving" {
			t.Errorf("%s: the refused sandbox's next command: %q %q", name, res.Stdout, res.Stderr)
		}
	}
}
