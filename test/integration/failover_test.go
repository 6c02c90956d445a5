package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// api is a tenant's plain HTTP client of one node's public API.
type api struct {
	base, key string
}

func (a api) do(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", a.key)
	req.Header.Set("content-type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func (a api) must(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	code, out := a.do(t, method, path, body)
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %v", method, path, code, out)
	}
	return out
}

// events lists a session's whole log, oldest first, page by page.
func (a api) events(t *testing.T, sessionID string) []map[string]any {
	t.Helper()
	var all []map[string]any
	page := ""
	for {
		path := "/v1/sessions/" + sessionID + "/events?beta=true&limit=5"
		if page != "" {
			path += "&page=" + page
		}
		out := a.must(t, "GET", path, nil)
		data, _ := out["data"].([]any)
		for _, d := range data {
			all = append(all, d.(map[string]any))
		}
		next, _ := out["next_page"].(string)
		if next == "" {
			return all
		}
		page = next
	}
}

// findFile returns the path of the first file named name under dir.
func findFile(dir, name string) string {
	var found string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name && found == "" {
			found = p
		}
		return nil
	})
	return found
}

// TestFailoverMidToolCall is issue 6 item 5: three `corral server` nodes
// on one PostgreSQL and two `corral host` agents (the process runtime:
// both agents on one machine, and a command's files visible to the test).
// A session's turn runs a bash command that writes "start", waits, writes
// "done"; the node running the session is killed with SIGKILL while the
// command runs; another node takes the session over and finishes the turn.
// The log has no gap or duplicate, one tool use and one tool result, and
// the command ran once: the new runner re-attached by its execution id.
func TestFailoverMidToolCall(t *testing.T) {
	db := pgtest.New(t)
	nodes := startCluster(t, db, "--sandbox-runtime", "process")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Two host agents, joined with tokens from the admin API.
	var cps []string
	for _, n := range nodes {
		cps = append(cps, n.hostAddr)
	}
	hostDirs := make([]string, 2)
	for i := range hostDirs {
		tok, err := adminv1.NewHostsServiceClient(nodes[0].conn).IssueJoinToken(ctx, &adminv1.IssueJoinTokenRequest{})
		if err != nil {
			t.Fatalf("issuing a join token: %v", err)
		}
		hostDirs[i] = t.TempDir()
		h := startProc(t, fmt.Sprintf("host-%d", i), "host", "--control-plane", strings.Join(cps, ","),
			"--state-dir", hostDirs[i], "--listen", freeAddr(t), "--host-id", fmt.Sprintf("host-%d", i),
			"--runtime", "process", "--allow-untrusted-process-runtime", "--join-token", tok.GetToken(),
			"--heartbeat-interval", "1s")
		h.await(t, false, "registered with the control plane", 1)
	}

	// A tenant key, then an agent with the toolset and a session, on n1.
	keys := adminv1.NewTenantsServiceClient(nodes[0].conn)
	if _, err := keys.CreateTenant(ctx, &adminv1.CreateTenantRequest{TenantId: "tenant_failover", Name: "failover"}); err != nil {
		t.Fatal(err)
	}
	k, err := keys.CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{TenantId: "tenant_failover", Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	at := func(n *serverNode) api { return api{base: "http://" + n.httpAddr, key: k.GetSecret()} }
	c1 := at(nodes[0])
	agent := c1.must(t, "POST", "/v1/agents?beta=true", map[string]any{"name": "failover", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	env := c1.must(t, "POST", "/v1/environments?beta=true", map[string]any{"name": "failover"})
	sess := c1.must(t, "POST", "/v1/sessions?beta=true", map[string]any{"agent": agent["id"], "environment_id": env["id"]})
	id := sess["id"].(string)

	// The message goes to n2: the node a client sends input to takes the
	// session's runner role, so n2 runs this turn. (No semicolons: the
	// fake model's script splits on them. A relative path: the process
	// runtime has no /workspace, its commands start in the workspace.)
	runner, survivor := nodes[1], nodes[2]
	command := `echo start >> log && sleep 5 && echo done >> log && cat log`
	at(runner).must(t, "POST", "/v1/sessions/"+id+"/events?beta=true", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text",
			"text": `!tool bash {"command":"` + strings.ReplaceAll(command, `"`, `\"`) + `"}` + "\n!echo"}}},
	}})

	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range []*serverNode{survivor, nodes[0]} {
				if code, out := at(n).do(t, "GET", "/v1/sessions/"+id+"/events?beta=true&limit=100", nil); code == http.StatusOK {
					b, _ := json.Marshal(out["data"])
					t.Logf("the session's events (via %s): %s", n.id, b)
					return
				}
			}
		}
	})
	// Kill the runner once the command runs (its first line is written).
	var logPath string
	waitfor.Cond(t, 60*time.Second, "the command to start", func() bool {
		for _, d := range hostDirs {
			if p := findFile(d, "log"); p != "" {
				b, _ := os.ReadFile(p)
				if string(b) == "start\n" {
					logPath = p
					return true
				}
			}
		}
		return false
	})
	runner.kill()
	t.Logf("killed %s while the command ran", runner.id)

	// Another node finishes the turn.
	cs := at(survivor)
	waitfor.Cond(t, 90*time.Second, "the turn to end on another node", func() bool {
		code, s := cs.do(t, "GET", "/v1/sessions/"+id+"?beta=true", nil)
		return code == http.StatusOK && s["status"] == "idle"
	})
	// The leader moved the runner role (Raft runner assignment) off n2.
	moved := ""
	for _, n := range []*serverNode{nodes[0], survivor} {
		for _, line := range strings.Split(n.proc.stderr.String(), "\n") {
			if strings.Contains(line, "session runner moved") && strings.Contains(line, id) && strings.Contains(line, "from="+runner.id) {
				moved = line
			}
		}
	}
	if moved == "" {
		t.Fatalf("no node logged moving the session's runner off %s", runner.id)
	}
	t.Logf("%s", moved[strings.Index(moved, "msg="):])
	b, err := os.ReadFile(logPath)
	if err != nil || string(b) != "start\ndone\n" {
		t.Fatalf("/workspace/log = %q (%v): the command must run once, to its end", b, err)
	}

	// The log: every event once, one tool use and its one result, which
	// carries the command's output.
	evs := cs.events(t, id)
	seen := map[string]bool{}
	var types []string
	var uses, results []map[string]any
	for _, e := range evs {
		eid := e["id"].(string)
		if seen[eid] {
			t.Fatalf("event %s listed twice", eid)
		}
		seen[eid] = true
		types = append(types, e["type"].(string))
		switch e["type"] {
		case "agent.tool_use":
			uses = append(uses, e)
		case "agent.tool_result":
			results = append(results, e)
		}
	}
	if len(uses) != 1 || len(results) != 1 || results[0]["tool_use_id"] != uses[0]["id"] {
		t.Fatalf("%d tool uses, %d results: %s", len(uses), len(results), strings.Join(types, " "))
	}
	if out, _ := json.Marshal(results[0]["content"]); !strings.Contains(string(out), `start\ndone`) || results[0]["is_error"] == true {
		t.Fatalf("tool result %v", results[0])
	}
	want := "user.message session.status_running span.model_request_start agent.tool_use span.model_request_end " +
		"agent.tool_result span.model_request_start agent.message span.model_request_end session.status_idle"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("log:\n got  %s\n want %s", got, want)
	}

	// Sequence numbers are dense: nothing lost, nothing doubled.
	conn, err := pgx.Connect(ctx, db.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT seq FROM events WHERE session_id = $1 ORDER BY seq", id)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("sequence numbers %v: not 1..%d", seqs, len(seqs))
		}
	}
	if len(seqs) != len(evs) {
		t.Fatalf("%d events stored, %d listed", len(seqs), len(evs))
	}
}
