package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
)

// TestDevPausesIdleSandboxHoldingOnlyItsDisk: `corral dev
// --pausable-sandboxes`, with a policy that pauses gVisor sandboxes after
// a second idle, pauses a session's sandbox after its turn; the fleet
// (the admin API's hosts) then reserves no CPU or memory for it and, of
// disk, only what its host measured it holds, far under its 1 GiB
// request. The next turn resumes it with its file, and the whole request
// is reserved again.
func TestDevPausesIdleSandboxHoldingOnlyItsDisk(t *testing.T) {
	requireGVisor(t)
	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	policyDir := filepath.Join(t.TempDir(), "policy")
	if err := os.MkdirAll(policyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	yamls, _ := filepath.Glob("../../policy/*.yaml")
	for _, p := range yamls {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(p) == "runtimes.yaml" {
			if !strings.Contains(string(b), "pause_after_idle_seconds: 0") {
				t.Fatal("policy/runtimes.yaml no longer says pause_after_idle_seconds: 0 for gvisor")
			}
			b = []byte(strings.Replace(string(b), "pause_after_idle_seconds: 0", "pause_after_idle_seconds: 1", 1))
		}
		if err := os.WriteFile(filepath.Join(policyDir, filepath.Base(p)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--runtime", "gvisor",
		"--pausable-sandboxes", "--no-warm-pools", "--policy-dir", policyDir)
	dev.waitListening(t)
	env := readEnv(t, dir)
	c := api{base: env["CORRAL_URL"], key: env["CORRAL_API_KEY"]}
	ops := api{base: env["CORRAL_URL"], key: env["CORRAL_OPERATOR_KEY"]}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("corral dev's log:\n%s", dev.stderr.String())
		}
	})
	agent := c.must(t, "POST", "/v1/agents?beta=true", map[string]any{"name": "pause", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	envr := c.must(t, "POST", "/v1/environments?beta=true", map[string]any{"name": "pause"})
	session := c.must(t, "POST", "/v1/sessions?beta=true", map[string]any{"agent": agent["id"], "environment_id": envr["id"]})["id"].(string)
	t.Cleanup(func() { c.do(t, "DELETE", "/v1/sessions/"+session+"?beta=true", nil) })

	// turn plays one bash call and returns its result's text.
	results := 0
	turn := func(command string) string {
		t.Helper()
		in, _ := json.Marshal(map[string]any{"command": command})
		msg := map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "!tool bash " + string(in)}}},
		}}
		if code, out := c.do(t, "POST", "/v1/sessions/"+session+"/events?beta=true", msg); code != http.StatusOK {
			t.Fatalf("sending %s: %d %v", command, code, out)
		}
		var last map[string]any
		waitfor.Cond(t, 2*time.Minute, "the turn of "+command+" to end", func() bool {
			n := 0
			for _, e := range allEvents(t, c, session) {
				switch e["type"] {
				case "agent.tool_result":
					n++
					last = e
				case "session.error":
					t.Fatalf("session.error: %v", e["error"])
				case "session.status_idle":
					if n > results {
						return true
					}
				}
			}
			return false
		})
		results++
		var text strings.Builder
		for _, b := range last["content"].([]any) {
			text.WriteString(fmt.Sprint(b.(map[string]any)["text"]))
		}
		return text.String()
	}
	// allocated is what the fleet reserves on the dev host.
	allocated := func() (cpu, mem, disk int64) {
		t.Helper()
		hosts, _ := ops.must(t, "GET", "/admin/v1/hosts", nil)["hosts"].([]any)
		if len(hosts) != 1 {
			t.Fatalf("the dev fleet has %d hosts, want 1", len(hosts))
		}
		a, _ := hosts[0].(map[string]any)["allocated"].(map[string]any)
		n := func(k string) int64 { v, _ := strconv.ParseInt(fmt.Sprint(a[k]), 10, 64); return v }
		return n("cpu_millis"), n("memory_mib"), n("disk_mib")
	}

	if out := turn("echo kept > f.txt && echo written"); out != "written" {
		t.Fatalf("first turn: %q", out)
	}
	var held int64
	waitfor.Cond(t, time.Minute, "the idle session's sandbox to be paused, holding only its disk", func() bool {
		cpu, mem, disk := allocated()
		held = disk
		return cpu == 0 && mem == 0 && disk > 0 && disk < 1024
	})
	if out := turn("cat f.txt"); out != "kept" {
		t.Fatalf("after the resume: %q", out)
	}
	// The turn resumed it (its whole request reserved again, until the
	// next pause a second on), which the fleet says.
	if !strings.Contains(dev.stderr.String(), "resumed a paused sandbox") {
		t.Fatal("corral dev's log says no paused sandbox was resumed")
	}
	t.Logf("paused, the sandbox held %d MiB of its 1024 MiB disk request", held)
}
