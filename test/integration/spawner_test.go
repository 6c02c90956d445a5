package integration

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/spawn"
)

// TestPausableHostRunsTheCompiledSpawner: `corral host --pausable-sandboxes`
// finds corral-spawn beside its executable, as make build leaves them:
// a new sandbox's init is the compiled spawner, mounted read-only, a
// command runs as init's child in a session of its own, and a command
// left running in the background outlives the one that started it. The
// host says nothing of the shell spawner.
func TestPausableHostRunsTheCompiledSpawner(t *testing.T) {
	requireGVisor(t)
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "host")
	var nonce [4]byte
	rand.Read(nonce[:])
	hostID := "itest-" + hex.EncodeToString(nonce[:])

	ctlAddr, ctlDir, token := startHostctl(t, dir)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(stateDir, "containerd")})
	host := startProc(t, "corral host", "host", "--control-plane", ctlAddr, "--state-dir", stateDir, "--listen", freeAddr(t),
		"--host-id", hostID, "--runtime", "gvisor", "--pausable-sandboxes", "--containerd-address", containerdAddress(),
		"--no-warm-pools", "--join-token", token)
	host.await(t, false, "registered with the control plane", 1)

	hc := func(args ...string) (string, string, error) {
		return corral(t, append([]string{"hostctl", "--dir", ctlDir}, args...)...)
	}
	t.Cleanup(func() { hc("destroy", "--host", hostID, "--key", "s1") })
	if out, errOut, err := hc("ensure", "--host", hostID, "--key", "s1", "--image", debianImage); err != nil || !strings.Contains(out, "SANDBOX_STATE_READY") {
		t.Fatalf("ensure: %v\n%s%s", err, out, errOut)
	}
	exec := func(script string) string {
		t.Helper()
		out, errOut, err := hc("exec", "--host", hostID, "--key", "s1", "--", "sh", "-c", script)
		if err != nil {
			t.Fatalf("exec %q: %v %s", script, err, errOut)
		}
		return strings.TrimSpace(out)
	}
	if got := exec(`tr '\0' ' ' </proc/1/cmdline`); !strings.HasPrefix(got, "/.corral-spawn init ") {
		t.Fatalf("the sandbox's init is %q, want the compiled spawner", got)
	}
	if got := exec(`grep ' /.corral-spawn ' /proc/self/mounts`); !strings.Contains(got, "ro") {
		t.Fatalf("the spawner's mount: %q, want read-only", got)
	}
	// Its parent is init; its session is its own (its sid is its pid).
	if got := exec(`set -- $(cut -d' ' -f4,6 /proc/$$/stat); echo "ppid=$1 own-session=$([ "$2" = $$ ] && echo yes)"`); got != "ppid=1 own-session=yes" {
		t.Fatalf("a command's parent and session: %q", got)
	}
	exec(`sleep 600 >/dev/null 2>&1 & echo $! > /tmp/bg.pid`)
	if got := exec(`kill -0 "$(cat /tmp/bg.pid)" && echo alive`); got != "alive" {
		t.Fatalf("the background process of the command before: %q", got)
	}
	if strings.Contains(host.stderr.String(), "shell spawner") {
		t.Fatalf("the host fell back to the shell spawner:\n%s", host.stderr.String())
	}
}

// TestHostRefusesASpawnerOfAnotherBuild: `corral host --pausable-sandboxes
// --spawn-binary X` where X answers `version` with other interfaces than
// this build's (a corral-spawn left from another release) refuses to
// start, in one line naming both, rather than fail every command.
func TestHostRefusesASpawnerOfAnotherBuild(t *testing.T) {
	requireGVisor(t)
	dir := t.TempDir()
	other := filepath.Join(dir, "corral-spawn")
	if err := os.WriteFile(other, []byte("#!/bin/sh\necho 'corral-spawn init 1, relay 0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := corral(t, "host", "--control-plane", "127.0.0.1:1", "--state-dir", filepath.Join(dir, "host"), "--host-id", "h1", "--join-token", "x",
		"--runtime", "gvisor", "--pausable-sandboxes", "--spawn-binary", other, "--containerd-address", containerdAddress())
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if err == nil || len(lines) != 1 || !strings.Contains(lines[0], "relay 0") || !strings.Contains(lines[0], spawn.Interface()) {
		t.Fatalf("want one line naming the spawner's versions and this build's, got %v:\n%s", err, errOut)
	}
}

// startHostctl starts `corral hostctl serve` in dir and returns its
// address, its directory and a join token for a host.
func startHostctl(t *testing.T, dir string) (addr, ctlDir, token string) {
	t.Helper()
	ctlDir, addr = filepath.Join(dir, "ctl"), freeAddr(t)
	ctl := startProc(t, "hostctl serve", "hostctl", "serve", "--dir", ctlDir, "--listen", addr, "--heartbeat-interval", "1s")
	ctl.await(t, true, "start a host with", 1)
	for _, line := range strings.Split(ctl.stdout.String(), "\n") {
		if strings.HasPrefix(line, "join token") {
			token = line[strings.LastIndex(line, " ")+1:]
		}
	}
	return addr, ctlDir, token
}
