package integration

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// `corral host --runtime gvisor,runc` offers both runtimes from one
// agent: it registers both with a provider each, an ensure of each
// runtime runs under that runtime (gVisor's kernel answers in one, the
// host's in the other), an ensure of a runtime it does not offer is
// refused naming the ones it does, and after a kill -9 the restarted
// agent re-attaches both sandboxes, each through its own driver.
func TestHostAgentOffersTwoRuntimes(t *testing.T) {
	requireGVisor(t)
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "host")
	var nonce [4]byte
	rand.Read(nonce[:])
	hostID := "itest-" + hex.EncodeToString(nonce[:])

	ctlAddr, ctlDir, token := startHostctl(t, dir)
	hostArgs := []string{"host", "--control-plane", ctlAddr, "--state-dir", stateDir, "--listen", freeAddr(t),
		"--host-id", hostID, "--runtime", "gvisor,runc", "--containerd-address", containerdAddress(), "--no-warm-pools"}
	// Each runtime's driver keeps a state dir of its own (gVisor's the
	// one a host of one runtime has); whatever happens, nothing of either
	// is left behind.
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(stateDir, "containerd")})
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeRunc,
		StateDir: filepath.Join(stateDir, "containerd-runc")})
	host := startProc(t, "corral host", append(hostArgs, "--join-token", token)...)
	host.await(t, false, "registered with the control plane", 1)

	hc := func(args ...string) (string, string, error) {
		return corral(t, append([]string{"hostctl", "--dir", ctlDir}, args...)...)
	}
	for _, rt := range []string{"gvisor", "runc"} {
		key := "session-" + rt
		t.Cleanup(func() { hc("destroy", "--host", hostID, "--key", key) })
		start := time.Now()
		out, errOut, err := hc("ensure", "--host", hostID, "--key", key, "--image", debianImage, "--runtime", rt)
		if err != nil || !strings.Contains(out, "SANDBOX_STATE_READY") || !strings.Contains(out, "containerd-"+rt) {
			t.Fatalf("ensure of runtime %s: %v\n%s%s", rt, err, out, errOut)
		}
		t.Logf("%s sandbox ready in %v", rt, time.Since(start))
	}
	_, errOut, err := hc("ensure", "--host", hostID, "--key", "session-kata", "--image", debianImage, "--runtime", "kata")
	if err == nil || !strings.Contains(errOut, "runs runtime gvisor, runc") {
		t.Fatalf("ensure of a runtime the host does not offer: %v %q", err, errOut)
	}
	hostKernel, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	kernels := func(when string) {
		t.Helper()
		for _, rt := range []string{"gvisor", "runc"} {
			out, errOut, err := hc("exec", "--host", hostID, "--key", "session-"+rt, "--", "cat", "/proc/version")
			if err != nil {
				t.Fatalf("%s: exec in the %s sandbox: %v %s", when, rt, err, errOut)
			}
			if host := out == string(hostKernel); host != (rt == "runc") {
				t.Fatalf("%s: the %s sandbox's kernel is %q (the host's: %q)", when, rt, out, hostKernel)
			}
		}
	}
	kernels("first")
	if _, errOut, err := hc("exec", "--host", hostID, "--key", "session-runc", "--", "sh", "-c", "echo runc-kept > /workspace/kept.txt"); err != nil {
		t.Fatalf("writing in the runc sandbox: %v %s", err, errOut)
	}
	out, _, err := hc("hosts")
	var hosts []struct {
		Runtimes []string `json:"runtimes"`
	}
	if err != nil || json.Unmarshal([]byte(out), &hosts) != nil || len(hosts) != 1 || strings.Join(hosts[0].Runtimes, ",") != "gvisor,runc" {
		t.Fatalf("hosts: %v, want one host of runtimes gvisor and runc:\n%s", err, out)
	}

	host.kill9(t)
	host = startProc(t, "corral host (restarted)", hostArgs...)
	host.await(t, false, "registered with the control plane", 1)
	if n := strings.Count(host.stderr.String(), "re-attached to sandbox"); n != 2 {
		t.Fatalf("the restarted agent re-attached %d sandboxes, want 2:\n%s", n, host.stderr.String())
	}
	kernels("after kill -9")
	if out, _, err := hc("read", "--host", hostID, "--key", "session-runc", "kept.txt"); err != nil || out != "runc-kept\n" {
		t.Fatalf("the runc sandbox's file after kill -9: %v %q", err, out)
	}
}
