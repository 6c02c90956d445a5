package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// toolCluster is three `corral server` processes, host agents joined to
// them, and one tenant's session whose agent has the built-in toolset:
// the stage of the tests of faults around a tool call.
type toolCluster struct {
	nodes    []*serverNode
	hosts    []*proc
	hostArgs [][]string
	hostDirs []string
	client   api // on nodes[0]
	session  string
}

// startToolCluster starts it: runtime is the sandboxes' (process or
// gvisor); every host heartbeats every heartbeat; extra are more flags of
// every node.
func startToolCluster(t *testing.T, db *pgtest.DB, runtime string, hosts int, heartbeat time.Duration, extra ...string) *toolCluster {
	t.Helper()
	tc := &toolCluster{nodes: startCluster(t, db, append([]string{"--sandbox-runtime", runtime, "--host-heartbeat-interval", heartbeat.String()}, extra...)...)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cps []string
	for _, n := range tc.nodes {
		cps = append(cps, n.hostAddr)
	}
	for i := range hosts {
		tok, err := adminv1.NewHostsServiceClient(tc.nodes[0].conn).IssueJoinToken(ctx, &adminv1.IssueJoinTokenRequest{})
		if err != nil {
			t.Fatalf("issuing a join token: %v", err)
		}
		dir := t.TempDir()
		args := []string{"host", "--control-plane", strings.Join(cps, ","), "--state-dir", dir, "--listen", freeAddr(t),
			"--host-id", fmt.Sprintf("host-%d", i), "--runtime", runtime, "--heartbeat-interval", heartbeat.String()}
		switch runtime {
		case "process":
			args = append(args, "--allow-untrusted-process-runtime")
		case "gvisor":
			args = append(args, "--containerd-address", containerdAddress())
			// Sandboxes outlive their agents: whatever happens, the ones
			// this host made are destroyed after it stopped.
			containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
				StateDir: filepath.Join(dir, "containerd")})
		}
		h := startProc(t, fmt.Sprintf("host-%d", i), append(args, "--join-token", tok.GetToken())...)
		h.await(t, false, "registered with the control plane", 1)
		tc.hosts, tc.hostArgs, tc.hostDirs = append(tc.hosts, h), append(tc.hostArgs, args), append(tc.hostDirs, dir)
	}
	keys := adminv1.NewTenantsServiceClient(tc.nodes[0].conn)
	if _, err := keys.CreateTenant(ctx, &adminv1.CreateTenantRequest{TenantId: "tenant_faults", Name: "faults"}); err != nil {
		t.Fatal(err)
	}
	k, err := keys.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{TenantId: "tenant_faults", Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	tc.client = api{base: "http://" + tc.nodes[0].httpAddr, key: k.GetSecret()}
	agent := tc.client.must(t, "POST", "/v1/agents?beta=true", map[string]any{"name": "faults", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	env := tc.client.must(t, "POST", "/v1/environments?beta=true", map[string]any{"name": "faults"})
	tc.session = tc.client.must(t, "POST", "/v1/sessions?beta=true", map[string]any{"agent": agent["id"], "environment_id": env["id"]})["id"].(string)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := json.Marshal(tc.client.events(t, tc.session))
			t.Logf("the session's events: %s", b)
		}
		// The session goes, and its sandbox with it, while the hosts run.
		waitfor.Cond(t, time.Minute, "the session to be deleted", func() bool {
			code, _ := tc.client.do(t, "DELETE", "/v1/sessions/"+tc.session+"?beta=true", nil)
			return code == http.StatusOK || code == http.StatusNotFound
		})
	})
	return tc
}

// bash sends a turn whose model calls bash with command (no semicolons:
// the fake model's script splits on them) and then answers.
func (tc *toolCluster) bash(t *testing.T, command string) {
	t.Helper()
	tc.client.must(t, "POST", "/v1/sessions/"+tc.session+"/events?beta=true", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text",
			"text": `!tool bash {"command":"` + strings.ReplaceAll(command, `"`, `\"`) + `"}` + "\n!echo"}}},
	}})
}

// workspaceFile waits until a workspace file of the session shows want
// on one of the hosts, and returns its path there.
func (tc *toolCluster) workspaceFile(t *testing.T, name, want string) string {
	t.Helper()
	var path string
	waitfor.Cond(t, 2*time.Minute, name+" to read "+want, func() bool {
		for _, d := range tc.hostDirs {
			if p := findFile(d, name); p != "" {
				if b, _ := os.ReadFile(p); string(b) == want {
					path = p
					return true
				}
			}
		}
		return false
	})
	return path
}

// oneResult waits for the turn to end and checks the log: every tool use
// has exactly one result, no session.error; it returns the one result.
func (tc *toolCluster) oneResult(t *testing.T) map[string]any {
	t.Helper()
	waitfor.Cond(t, 3*time.Minute, "the turn to end", func() bool {
		code, s := tc.client.do(t, "GET", "/v1/sessions/"+tc.session+"?beta=true", nil)
		return code == http.StatusOK && s["status"] == "idle"
	})
	var uses, results []map[string]any
	var types []string
	for _, e := range tc.client.events(t, tc.session) {
		types = append(types, e["type"].(string))
		switch e["type"] {
		case "agent.tool_use":
			uses = append(uses, e)
		case "agent.tool_result":
			results = append(results, e)
		case "session.error":
			t.Fatalf("session error %v (log: %s)", e, strings.Join(types, " "))
		}
	}
	if len(uses) != 1 || len(results) != 1 || results[0]["tool_use_id"] != uses[0]["id"] {
		t.Fatalf("%d tool uses, %d results: %s", len(uses), len(results), strings.Join(types, " "))
	}
	return results[0]
}

func resultText(r map[string]any) string {
	b, _ := json.Marshal(r["content"])
	return string(b)
}

// TestToolCallSurvivesPostgresRestart: PostgreSQL goes down while a
// command runs and comes back only after the command has finished, so the
// tool result's commit fails at first. The loop retries it: the log has
// one result with the command's output and no session.error, and the
// command ran once.
func TestToolCallSurvivesPostgresRestart(t *testing.T) {
	db := pgtest.New(t)
	tc := startToolCluster(t, db, "process", 1, time.Second)
	tc.bash(t, `echo run >> runs && while [ ! -e go ]\ndo sleep 0.05\ndone\necho done >> runs && cat runs`)
	runs := tc.workspaceFile(t, "runs", "run\n")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := time.Now()
	if err := pgtest.Cluster(t).Restart(ctx, func() {
		// While PostgreSQL is down, the command ends: its result cannot
		// be stored until it is back.
		if err := os.WriteFile(filepath.Join(filepath.Dir(runs), "go"), nil, 0o644); err != nil {
			t.Error(err)
		}
		tc.workspaceFile(t, "runs", "run\ndone\n")
	}); err != nil {
		t.Fatalf("restarting PostgreSQL: %v", err)
	}
	t.Logf("PostgreSQL was down for %v while the command finished", time.Since(started).Round(time.Millisecond))
	r := tc.oneResult(t)
	if r["is_error"] == true || !strings.Contains(resultText(r), `run\ndone`) {
		t.Fatalf("tool result %v", r)
	}
	if b, _ := os.ReadFile(runs); string(b) != "run\ndone\n" {
		t.Fatalf("runs = %q: the command must run once", b)
	}
}

// TestToolCallSurvivesHostAgentRestart: the host agent of a gVisor sandbox
// is killed (kill -9) while a command runs in it and starts again; the
// control plane's broken exec stream re-attaches by the execution id. The
// restarted agent does not know how the command ended (its output went
// with the old process), so the one tool result says so, as an error the
// model sees, and the command is not run a second time.
func TestToolCallSurvivesHostAgentRestart(t *testing.T) {
	requireGVisor(t)
	db := pgtest.New(t)
	// Heartbeats every 3s: the host is down after 9s of silence, longer
	// than its restart takes, so the sandbox stays placed on it.
	tc := startToolCluster(t, db, "gvisor", 1, 3*time.Second)
	tc.bash(t, "echo run >> /workspace/runs && sleep 2 && echo done >> /workspace/runs")
	runs := tc.workspaceFile(t, "runs", "run\n")
	tc.hosts[0].kill9(t)
	killed := time.Now()
	tc.hosts[0] = startProc(t, "host-0 (restarted)", tc.hostArgs[0]...) // it has its certificate
	tc.hosts[0].await(t, false, "registered with the control plane", 1)
	t.Logf("host agent killed and back in %v", time.Since(killed).Round(time.Millisecond))
	r := tc.oneResult(t)
	if r["is_error"] != true || !strings.Contains(resultText(r), "the host agent restarted while this command ran") {
		t.Fatalf("tool result %v, want the lost command said as an error", r)
	}
	// The command ran once: one "run" line (and a "done" if the sandbox
	// kept running it after its agent died).
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "run\n") != 1 {
		t.Fatalf("runs = %q", b)
	}
	// The session goes, and the restarted host destroys its sandbox.
	tc.client.must(t, "DELETE", "/v1/sessions/"+tc.session+"?beta=true", nil)
	waitfor.State(t, time.Minute, "the session's container to go", func() (bool, string) {
		left := sessionContainers(t, tc.session)
		return len(left) == 0, fmt.Sprint(left)
	})
}

// TestHostKilledSessionGoesOnFromItsSnapshot: the host agent of a session's
// gVisor sandbox is killed (kill -9) and never comes back. Its placement
// moves to the other host once it is down, and the session's next tool
// call finds there the files of its last turn, restored from the snapshot
// taken at that turn's end (the nodes share a blob directory, as they
// would an S3 bucket), with a notice naming the snapshot.
func TestHostKilledSessionGoesOnFromItsSnapshot(t *testing.T) {
	requireGVisor(t)
	db := pgtest.New(t)
	tc := startToolCluster(t, db, "gvisor", 2, time.Second, "--blob-dir", t.TempDir())
	tc.bash(t, `mkdir -p /workspace/src && echo kept-from-the-turn > /workspace/src/kept.txt && echo written`)
	path := tc.workspaceFile(t, "kept.txt", "kept-from-the-turn\n")
	if r := tc.oneResult(t); r["is_error"] == true || !strings.Contains(resultText(r), "written") {
		t.Fatalf("first turn: %v", r)
	}
	lost := -1
	for i, d := range tc.hostDirs {
		if strings.HasPrefix(path, d+"/") {
			lost = i
		}
	}
	if lost < 0 {
		t.Fatalf("kept.txt at %s is on no host", path)
	}
	tc.hosts[lost].kill9(t)
	other := fmt.Sprintf("host-%d", 1-lost)
	sandboxes := adminv1.NewSandboxesServiceClient(tc.nodes[0].conn)
	waitfor.State(t, time.Minute, "the sandbox to be placed on "+other, func() (bool, string) {
		resp, err := sandboxes.ListSandboxes(context.Background(), &adminv1.ListSandboxesRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, sb := range resp.GetSandboxes() {
			if sb.GetSessionId() == tc.session {
				return sb.GetHostId() == other, sb.GetHostId()
			}
		}
		return false, "no placement"
	})
	tc.bash(t, `cat /workspace/src/kept.txt`)
	waitfor.Cond(t, 3*time.Minute, "the second turn to end", func() bool {
		var results int
		for _, e := range tc.client.events(t, tc.session) {
			if e["type"] == "agent.tool_result" {
				results++
			}
		}
		code, s := tc.client.do(t, "GET", "/v1/sessions/"+tc.session+"?beta=true", nil)
		return results == 2 && code == http.StatusOK && s["status"] == "idle"
	})
	var last map[string]any
	for _, e := range tc.client.events(t, tc.session) {
		if e["type"] == "agent.tool_result" {
			last = e
		}
	}
	text := resultText(last)
	if last["is_error"] == true || !strings.Contains(text, "lost with its host") || !strings.Contains(text, "restored from the snapshot taken at") ||
		!strings.Contains(text, "kept-from-the-turn") {
		t.Fatalf("the tool result after the host was killed: %s", text)
	}
	t.Logf("after the host was killed: %s", text)
}
