package server_test

// The limits of policy/runtimes.yaml are what a session's sandbox really
// gets: a node reads them, the placement carries them to a gVisor host, the
// bash tool applies them and the driver enforces them. These tests run
// through the whole path (REST API, agent loop with the fake model, fleet,
// host agent, containerd and runsc) and skip, saying why, on a machine
// without the runtime (failing under CI).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/policy"
)

// startGVisorHost joins a host agent with the containerd gVisor driver,
// its state under stateDir, to srv. The agent gets no default limits of
// its own: what its sandboxes get comes from the placements.
func startGVisorHost(t *testing.T, srv *server.Server, stateDir string) *containerd.Driver {
	t.Helper()
	return startGVisorHostWith(t, srv, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: stateDir})
}

// startGVisorHostWith is startGVisorHost over a driver of cfg.
func startGVisorHostWith(t *testing.T, srv *server.Server, cfg containerd.Config) *containerd.Driver {
	t.Helper()
	d := containerdtest.NewDriver(t, cfg)
	joinAgent(t, srv, agent.Config{
		HostID: "limits", Driver: d, Runtime: containerd.RuntimeGVisor,
	})
	return d
}

// policyDir writes the shipped roles and quotas beside runtimes, and
// returns the directory (a node's PolicyDir).
func policyDir(t *testing.T, runtimes string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"roles.yaml", "quotas.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "policy", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "runtimes.yaml"), []byte(runtimes), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// bash runs one bash tool call in the session and returns its result text.
// The fake model splits calls at ";", so the input spells it \u003b.
func (s *session) bash(command string) string {
	s.t.Helper()
	in, err := json.Marshal(map[string]string{"command": command})
	if err != nil {
		s.t.Fatal(err)
	}
	return toolOutput(s.t, s.turn("!tool bash "+strings.ReplaceAll(string(in), ";", `\u003b`)))
}

func TestPolicyLimitsApplied(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	dir := policyDir(t, `runtimes:
  gvisor:
    description: the test's profile
    trusted_only: false
    cpu_millis: 1000
    memory_mib: 1024
    pids: 64
    disk_mib: 64
    default_exec_timeout_seconds: 3
    exec_timeout_seconds: 3
    output_limit_bytes: 1024
`)
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PolicyDir: dir})
	startGVisorHost(t, srv, t.TempDir())
	s := newToolSession(t, srv)

	// The exec timeout: sleep 10 is killed at 3 s with the timeout result.
	start := time.Now()
	out := s.bash("sleep 10; echo finished")
	if !strings.Contains(out, "[command timed out after 3s and was killed (exit code 124)]") || strings.Contains(out, "finished") {
		t.Fatalf("sleep 10 under a 3 s limit: %q", out)
	}
	if took := time.Since(start); took > 9*time.Second {
		t.Errorf("the timed-out turn took %v", took)
	}
	// A timeout_ms above the profile's greatest is the model's mistake.
	if out := toolOutput(t, s.turn(`!tool bash {"command":"true","timeout_ms":3001}`)); !strings.Contains(out, "over the limit of 3000") {
		t.Errorf("timeout_ms 3001: %q", out)
	}

	// The output limit: 10 KiB on stdout is cut to 1 KiB (head and tail).
	out = s.bash(`head -c 10240 /dev/zero | tr '\0' x`)
	if !strings.Contains(out, "[output truncated") || !strings.Contains(out, "up to 1024 per stream") {
		t.Fatalf("10 KiB of output: no truncation note in %d bytes: %.200q", len(out), out)
	}
	if n := strings.Count(out, "x"); n > 1024 || n < 512 {
		t.Errorf("10 KiB of output kept %d bytes, want at most the 1024 limit", n)
	}

	// The pids limit: forking past 64 processes fails inside the sandbox.
	out = s.bash(`python3 -c '
import os, signal, time
pids = []
try:
    for i in range(100):
        p = os.fork()
        if p == 0:
            time.sleep(2)
            os._exit(0)
        pids.append(p)
    print("forked", len(pids))
except OSError as e:
    print("fork failed after", len(pids), "children:", os.strerror(e.errno))
for p in pids:
    os.kill(p, signal.SIGKILL)
'`)
	m := regexp.MustCompile(`fork failed after (\d+) children`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("100 forks under a 64 pids limit: %q", out)
	}
	if n, _ := strconv.Atoi(m[1]); n >= 64 {
		t.Errorf("%d children forked under a 64 pids limit", n)
	}
	// The sandbox still works after hitting its limits.
	if out := s.bash("echo alive"); out != "alive" {
		t.Errorf("after the limits: %q", out)
	}
}

func TestWorkspaceDiskLimitUnderProductionDefaults(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	pol, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	limit := int64(pol.Runtimes[admission.RuntimeGVisor].DiskMiB) << 20
	if limit <= 0 {
		t.Fatal("the shipped gvisor profile sets no disk limit")
	}
	// The shipped policy, nothing overridden: no PolicyDir, no DiskBytes.
	// The workspace's snapshots go to a blob store on another disk: the
	// check below is of the sandbox's own use of the host's.
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, BlobDir: shmDir(t)})
	stateDir := t.TempDir()
	startGVisorHost(t, srv, stateDir)
	s := newToolSession(t, srv)
	if out := s.bash("echo ready"); out != "ready" {
		t.Fatalf("first call: %q", out)
	}

	var fs syscall.Statfs_t
	if err := syscall.Statfs(stateDir, &fs); err != nil {
		t.Fatal(err)
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < 3*limit {
		t.Fatalf("the host has %d bytes free, too few to show a %d byte limit holds", free, limit)
	}
	// What the host agent's sandboxes hold on the host's disk: the blocks
	// allocated under its state dir (the workspace images), not the disk's
	// free space, which other jobs beside the test change.
	before := allocated(t, stateDir)
	out := s.bash("dd if=/dev/zero of=/workspace/f bs=1M; echo dd exit $?; ls -l /workspace/f")
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "dd exit 0") {
		t.Fatalf("filling /workspace: %q", out)
	}
	m := regexp.MustCompile(`\S+\s+\d+\s+\S+\s+\S+\s+(\d+)\s.*/workspace/f`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no size of /workspace/f in %q", out)
	}
	if size, _ := strconv.ParseInt(m[1], 10, 64); size > limit || size < limit/2 {
		t.Errorf("/workspace/f stopped at %d bytes, want about the policy's %d", size, limit)
	}
	// 64 MiB of slack: the file system's own metadata in the image.
	if used := allocated(t, stateDir) - before; used > limit+64<<20 || used < limit/2 {
		t.Errorf("the sandbox's files on the host grew by %d bytes, want about the %d byte limit and no more", used, limit)
	}
	// The session keeps working once its workspace is full, and frees it.
	if out := s.bash("rm /workspace/f && echo freed"); out != "freed" {
		t.Errorf("after the fill: %q", out)
	}
	// The outputs are within the same limit: a sandbox cannot fill the
	// host's disk through them either.
	before = allocated(t, stateDir)
	// Bounded: were the outputs unbounded, dd ends (exit 0) past the limit
	// instead of filling the machine's disk.
	out = s.bash(fmt.Sprintf("dd if=/dev/zero of=/mnt/session/outputs/f bs=1M count=%d; echo dd exit $?; rm -f /mnt/session/outputs/f", limit>>20+64))
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "dd exit 0") {
		t.Fatalf("filling /mnt/session/outputs: %q", out)
	}
	if used := allocated(t, stateDir) - before; used > limit+64<<20 {
		t.Errorf("filling the outputs grew the sandbox's files on the host by %d bytes, past the %d byte limit", used, limit)
	}
}

// A trusted_only runtime (runc) runs only the sessions of tenants whose
// policy grants it: on a runc node another tenant's session create is a
// 403 naming the class and why; nothing is stored.
func TestTrustedOnlyRuntimeNeedsTheTenantsGrant(t *testing.T) {
	runtimes, err := os.ReadFile(filepath.Join("..", "..", "policy", "runtimes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := policyDir(t, string(runtimes))
	quotas, err := os.ReadFile(filepath.Join(dir, "quotas.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	granted := strings.Replace(string(quotas), "trusted_runtimes: {}", "trusted_runtimes:\n  tenant_trusted: [runc]", 1)
	if granted == string(quotas) {
		t.Fatal("the shipped quotas.yaml has no trusted_runtimes: {} to edit")
	}
	if err := os.WriteFile(filepath.Join(dir, "quotas.yaml"), []byte(granted), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeRunc, PolicyDir: dir})
	base := "http://" + srv.HTTPAddr()
	for _, tc := range []struct {
		tenant tenant.ID
		want   int
	}{{tenant.Default, 403}, {"tenant_trusted", 409}} {
		c := withKey(servertest.TenantKey(t, srv, tc.tenant))
		ag := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "a", "model": "fake", "tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
		env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})
		body, _ := json.Marshal(map[string]any{"agent": ag["id"], "environment_id": env["id"]})
		resp, err := c.Post(base+"/v1/sessions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Fatalf("%s: session create %d %s, want %d", tc.tenant, resp.StatusCode, msg, tc.want)
		}
		// A tenant without the grant may not use the node's runc class; one
		// with it may, but no host offers runc here (none joined).
		if tc.want == 403 && !strings.Contains(string(msg), "sandbox class runc is not one this tenant may use") {
			t.Errorf("%s: the refusal does not say which class and why: %s", tc.tenant, msg)
		}
		if tc.want == 409 && !strings.Contains(string(msg), "offers sandbox class runc (provider runc)") {
			t.Errorf("%s: the refusal does not say which class no host offers: %s", tc.tenant, msg)
		}
	}
}

// shmDir is a directory on another file system than the test's temporary
// directories (/dev/shm, a tmpfs), removed at the end.
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "corral-blobs-")
	if err != nil {
		t.Fatalf("a directory on /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// allocated sums the blocks allocated to the files under dir on dir's
// own file system: a workspace image counts, not the mount of it.
func allocated(t testing.TB, dir string) int64 {
	t.Helper()
	var root syscall.Stat_t
	if err := syscall.Stat(dir, &root); err != nil {
		t.Fatal(err)
	}
	var n int64
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return nil // gone while walking, or not ours to read
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok:
		case st.Dev != root.Dev && e.IsDir():
			return filepath.SkipDir
		default:
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
