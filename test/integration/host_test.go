package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

const debianImage = "localhost/corral/debian:bookworm-2"

// containerdAddress is the private containerd of scripts/runtime, or
// CORRAL_CONTAINERD_ADDRESS.
func containerdAddress() string {
	if a := os.Getenv("CORRAL_CONTAINERD_ADDRESS"); a != "" {
		return a
	}
	return "/var/lib/corral/containerd/containerd.sock"
}

// requireGVisor skips unless this machine runs gVisor sandboxes through the
// private containerd; under CI (where `make test` sets them up) it fails.
func requireGVisor(t *testing.T) {
	t.Helper()
	containerdtest.Address(t)
}

// watched is process output that tests can wait on without polling.
type watched struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	waiters []waiter
}

type waiter struct {
	substr string
	n      int
	ch     chan struct{}
}

func (w *watched) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	kept := w.waiters[:0]
	for _, wt := range w.waiters {
		if strings.Count(w.buf.String(), wt.substr) >= wt.n {
			close(wt.ch)
		} else {
			kept = append(kept, wt)
		}
	}
	w.waiters = kept
	return len(p), nil
}

func (w *watched) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// when returns a channel closed once substr appeared n times.
func (w *watched) when(substr string, n int) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	if strings.Count(w.buf.String(), substr) >= n {
		close(ch)
	} else {
		w.waiters = append(w.waiters, waiter{substr, n, ch})
	}
	return ch
}

type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr *watched
	done           chan struct{}
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(corralBin, args...), stdout: &watched{}, stderr: &watched{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// await waits for substr to appear n times in the process's stderr (or
// stdout, with out set).
func (p *proc) await(t *testing.T, out bool, substr string, n int) {
	t.Helper()
	w := p.stderr
	if out {
		w = p.stdout
	}
	select {
	case <-w.when(substr, n):
	case <-p.done:
		t.Fatalf("%s exited before printing %q:\n%s", p.name, substr, p.stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("%s did not print %q within 90s:\n%s", p.name, substr, p.stderr.String())
	}
}

func (p *proc) kill9(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// corral runs one corral command to completion.
func corral(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(corralBin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func TestHostAgentGVisorSurvivesKill9(t *testing.T) {
	requireGVisor(t)
	dir := t.TempDir()
	ctlDir, stateDir := filepath.Join(dir, "ctl"), filepath.Join(dir, "host")
	ctlAddr, sandboxAddr := freeAddr(t), freeAddr(t)
	var nonce [4]byte
	rand.Read(nonce[:])
	hostID := "itest-" + hex.EncodeToString(nonce[:])
	key := "session-1"

	ctl := startProc(t, "hostctl serve", "hostctl", "serve", "--dir", ctlDir, "--listen", ctlAddr, "--heartbeat-interval", "1s")
	ctl.await(t, true, "start a host with", 1)
	var token string
	for _, line := range strings.Split(ctl.stdout.String(), "\n") {
		if strings.HasPrefix(line, "join token") {
			token = line[strings.LastIndex(line, " ")+1:]
		}
	}
	hostArgs := []string{"host", "--control-plane", ctlAddr, "--state-dir", stateDir, "--listen", sandboxAddr,
		"--host-id", hostID, "--runtime", "gvisor", "--containerd-address", containerdAddress(), "--log-level", "debug"}
	// Whatever happens below, leave no sandbox behind, even if the agent is
	// dead when the test ends: after the agents stopped, the sandboxes the
	// host's driver made (its state dir's, in containerd) are destroyed.
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(stateDir, "containerd")})
	start := time.Now()
	host := startProc(t, "corral host", append(hostArgs, "--join-token", token)...)
	host.await(t, false, "registered with the control plane", 1)
	t.Logf("host joined and registered in %v", time.Since(start))

	hc := func(args ...string) (string, string, error) {
		return corral(t, append([]string{"hostctl", "--dir", ctlDir}, args...)...)
	}
	sb := []string{"--host", hostID, "--key", key}
	// The way a control plane removes it, while the agent runs (the sweep
	// above is the backstop).
	t.Cleanup(func() { hc(append([]string{"destroy"}, sb...)...) })

	start = time.Now()
	out, errOut, err := hc(append([]string{"ensure", "--image", debianImage, "--runtime", "gvisor"}, sb...)...)
	if err != nil || !strings.Contains(out, "SANDBOX_STATE_READY") || !strings.Contains(out, "containerd-gvisor") {
		t.Fatalf("ensure: %v\n%s%s", err, out, errOut)
	}
	t.Logf("gVisor sandbox ready in %v", time.Since(start))
	start = time.Now()
	out, errOut, err = hc(append(append([]string{"exec"}, sb...), "--", "python3", "-c", "print(6*7)")...)
	if err != nil || out != "42\n" {
		t.Fatalf("exec python3: %v: %q %q", err, out, errOut)
	}
	t.Logf("python3 in the sandbox, through the CLI, in %v", time.Since(start))
	// It is gVisor's kernel, not the host's, that answers.
	if out, _, err := hc(append(append([]string{"exec"}, sb...), "--", "sh", "-c", "dmesg 2>/dev/null | head -1; cat /proc/version")...); err != nil || !strings.Contains(out, "gVisor") && !strings.Contains(out, "gvisor") {
		t.Errorf("not a gVisor kernel: %v %q", err, out)
	}
	if _, errOut, err := hc(append(append([]string{"exec"}, sb...), "--", "sh", "-c", "echo survived > /workspace/kept.txt")...); err != nil {
		t.Fatalf("writing a workspace file: %v %s", err, errOut)
	}
	// A process left running in the sandbox outlives the agent too.
	if _, errOut, err := hc(append(append([]string{"exec"}, sb...), "--", "sh", "-c", "sleep 600 >/dev/null 2>&1 </dev/null & echo $! > /tmp/bg.pid")...); err != nil {
		t.Fatalf("starting a background process: %v %s", err, errOut)
	}
	out, errOut, err = hc(append(append([]string{"exec"}, sb...), "--", "sh", "-c", "exit 3")...)
	var ee *exec.ExitError
	if !errorAs(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit code not passed through: %v %q %q", err, out, errOut)
	}

	// Bad input: one clear error each, nothing half-made left behind.
	_, errOut, err = hc("ensure", "--host", hostID, "--key", "no-image", "--image", "localhost/corral/nope:1")
	if err == nil || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "nope") {
		t.Fatalf("ensure with a missing image: %v %q", err, errOut)
	}
	t.Logf("missing image: %s", strings.TrimSpace(errOut))
	_, errOut, err = hc(append([]string{"read"}, append(sb, "../../../etc/passwd")...)...)
	if err == nil || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("read outside the workspace: %v %q", err, errOut)
	}
	t.Logf("path outside the workspace: %s", strings.TrimSpace(errOut))

	const reported = "host reported its state" // hostctl, on a stream's first heartbeat
	reports := strings.Count(ctl.stderr.String(), reported)
	host.kill9(t)
	start = time.Now()
	host = startProc(t, "corral host (restarted)", hostArgs...) // no token: it has its certificate
	host.await(t, false, "registered with the control plane", 1)
	if !strings.Contains(host.stderr.String(), "re-attached to sandbox") {
		t.Fatalf("restarted agent did not re-attach:\n%s", host.stderr.String())
	}
	t.Logf("restarted and re-attached in %v", time.Since(start))
	out, errOut, err = hc(append([]string{"read"}, append(sb, "kept.txt")...)...)
	if err != nil || out != "survived\n" {
		t.Fatalf("workspace file after kill -9: %v %q %q", err, out, errOut)
	}
	out, _, err = hc(append(append([]string{"exec"}, sb...), "--", "python3", "-c", "print(6*7)")...)
	if err != nil || out != "42\n" {
		t.Fatalf("exec after restart: %v %q", err, out)
	}
	if out, errOut, err := hc(append(append([]string{"exec"}, sb...), "--", "sh", "-c", "kill -0 $(cat /tmp/bg.pid) && echo alive")...); err != nil || out != "alive\n" {
		t.Fatalf("background process after kill -9 of the agent: %v %q %q", err, out, errOut)
	}
	if strings.Count(host.stderr.String(), "sandbox ready") != 0 {
		t.Fatalf("the restarted agent made a new sandbox:\n%s", host.stderr.String())
	}
	// The failed ensure left nothing: the restarted agent holds one sandbox.
	// It reported its images and health. The controller's view is the dead
	// agent's last report until the restarted one's first heartbeat lands.
	ctl.await(t, false, reported, reports+1)
	out, _, err = hc("hosts")
	if err != nil || strings.Count(out, `"key"`) != 1 || !strings.Contains(out, debianImage) || !strings.Contains(out, "containerd_reachable") {
		t.Fatalf("hosts after restart: %v\n%s", err, out)
	}

	if _, errOut, err := hc(append([]string{"destroy"}, sb...)...); err != nil {
		t.Fatalf("destroy: %v %s", err, errOut)
	}
	_, errOut, err = hc(append(append([]string{"exec"}, sb...), "--", "true")...)
	if err == nil || !strings.Contains(errOut, "no sandbox") {
		t.Fatalf("exec after destroy: %v %q", err, errOut)
	}
	if ents, _ := os.ReadDir(filepath.Join(stateDir, "sandboxes")); len(ents) != 0 {
		t.Fatalf("records left after destroy: %v", ents)
	}
}

func TestHostRefusesBadRuntimeConfig(t *testing.T) {
	dir := t.TempDir()
	base := []string{"host", "--control-plane", "127.0.0.1:1", "--state-dir", dir, "--host-id", "h1", "--join-token", "x"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown runtime", []string{"--runtime", "kata"}, `unknown runtime "kata"`},
		{"missing runsc", []string{"--runtime", "gvisor", "--runsc", filepath.Join(dir, "no-runsc")}, "runsc binary"},
		{"containerd down", []string{"--runtime", "runc", "--containerd-address", filepath.Join(dir, "no.sock")}, "containerd is not reachable"},
		{"process without the unsafe flag", []string{"--runtime", "process"}, "allow-untrusted-process-runtime"},
		{"a runtime twice", []string{"--runtime", "gvisor,runc,gvisor"}, "--runtime names gvisor twice"},
		{"an unknown runtime beside a known one", []string{"--runtime", "gvisor,kata"}, `unknown runtime "kata"`},
		{"process beside gvisor without the unsafe flag", []string{"--runtime", "process,gvisor"}, "allow-untrusted-process-runtime"},
		{"a named spawner that is not there", []string{"--runtime", "gvisor", "--pausable-sandboxes", "--spawn-binary", filepath.Join(dir, "no-spawn")}, "the spawner binary"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, err := corral(t, append(base, c.args...)...)
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if err == nil || len(lines) != 1 || !strings.Contains(lines[0], c.want) {
				t.Fatalf("want one line about %q, got %v:\n%s", c.want, err, errOut)
			}
		})
	}
}

func errorAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}
