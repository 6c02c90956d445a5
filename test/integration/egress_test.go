package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/metrics/metricstest"
	"corral.dev/corral/internal/waitfor"
)

// egressProbe runs in the sandbox: HTTPS through the host's proxy to the
// allowed name and to one the environment does not list. (No semicolons:
// the fake model's script splits on them.)
const egressProbe = `import ssl, sys, urllib.request as u
c = ssl._create_unverified_context()
def g(x):
    try:
        return "OK " + u.urlopen(x, context=c, timeout=20).read().decode()
    except Exception as e:
        return "ERR " + str(e)
print(g("https://localhost:%s/" % sys.argv[1]))
print(g("https://denied.example/"))
`

// TestDevEgressAllowlist: through corral dev and the official SDK, an
// environment whose limited networking allows localhost (an upstream on
// this machine's loopback, which the dev host's --egress-allow-cidr lets
// its proxy dial) gives the session's gVisor sandbox exactly that: the
// allowed name answers, another is refused, and the tenant sees both in
// the egress trail through the admin API and `corral egress ls`.
func TestDevEgressAllowlist(t *testing.T) {
	requireGVisor(t)
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream says hi") }))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port

	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	grpcAddr := freeAddr(t)
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", grpcAddr, "--runtime", "gvisor", "--no-warm-pools",
		"--egress-allow-cidr", "127.0.0.1/32")
	dev.waitListening(t)
	env := readEnv(t, dir)
	client := anthropic.NewClient(option.WithBaseURL(env["CORRAL_URL"]), option.WithAPIKey(env["CORRAL_API_KEY"]),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	rest := func(method, path string, body any) map[string]any {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, env["CORRAL_URL"]+path, rd)
		req.Header.Set("x-api-key", env["CORRAL_API_KEY"])
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %s %s", method, path, resp.Status, b)
		}
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	envr := rest("POST", "/v1/environments", map[string]any{"name": "egress",
		"config": map[string]any{"type": "cloud", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"localhost"}}}})
	if n := envr["config"].(map[string]any)["networking"].(map[string]any); fmt.Sprint(n["allowed_hosts"]) != "[localhost]" {
		t.Fatalf("the environment reports %v", n)
	}
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "egress",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: envr["id"].(string),
	})
	if err != nil {
		t.Fatal(err)
	}
	// corral dev is killed, not stopped: its sandbox's namespaces go here
	// (the sweep removes the sandbox).
	t.Cleanup(func() { egress.Remove(context.Background(), sess.ID) })
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	result := strings.Join(bashTurns(t, ctx, client, sess.ID, s, fmt.Sprintf("python3 -c '%s' %d", egressProbe, port)), "")
	lines := strings.Split(strings.TrimSpace(result), "\n")
	if len(lines) != 2 || lines[0] != "OK upstream says hi" || !strings.Contains(lines[1], "403") {
		t.Fatalf("the sandbox's fetches: %q", result)
	}

	// The trail reaches PostgreSQL with the host's next heartbeats.
	var conns []any
	waitfor.Cond(t, 2*time.Minute, "both connections in the egress trail", func() bool {
		conns, _ = rest("GET", "/admin/v1/egress?session_id="+sess.ID, nil)["connections"].([]any)
		return len(conns) >= 2
	})
	byHost := map[string]map[string]any{}
	for _, c := range conns {
		m := c.(map[string]any)
		byHost[m["host"].(string)] = m
	}
	if a := byHost["localhost"]; a == nil || a["allowed"] != true || a["session_id"] != sess.ID {
		t.Errorf("allowed record: %v", a)
	}
	if d := byHost["denied.example"]; d == nil || d["allowed"] == true || d["reason"] != "host not allowed" {
		t.Errorf("denied record: %v", d)
	}
	out, err := exec.Command(corralBin, "egress", "ls", "--server", grpcAddr, "--api-key", env["CORRAL_API_KEY"], "--session", sess.ID).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "localhost:"+fmt.Sprint(port)) || !strings.Contains(string(out), "denied.example:443") || !strings.Contains(string(out), "host not allowed") {
		t.Fatalf("corral egress ls: %v\n%s", err, out)
	}
	t.Logf("corral egress ls:\n%s", out)
	// The host's metrics count both verdicts.
	m := metricstest.Get(t, env["CORRAL_HOST_METRICS_URL"])
	for _, verdict := range []string{"allowed", "denied"} {
		if v, ok := m.Value("corral_host_egress_connections_total", map[string]string{"verdict": verdict}); !ok || v < 1 {
			t.Errorf("corral_host_egress_connections_total{verdict=%s} = %v, %v; want at least 1", verdict, v, ok)
		}
	}
}

// unrestrictedProbe runs in the sandbox: HTTPS through the host's proxy
// to a name no allowlist lists (the upstream on this machine's loopback,
// which --egress-allow-cidr lets the proxy dial), then to an IP literal
// and to the metadata address, which the proxy refuses whatever the
// networking.
const unrestrictedProbe = `import ssl, sys, urllib.request as u
c = ssl._create_unverified_context()
def g(x):
    try:
        return "OK " + u.urlopen(x, context=c, timeout=20).read().decode()
    except Exception as e:
        return "ERR " + str(e)
print(g("https://localhost:%s/" % sys.argv[1]))
print(g("https://127.0.0.1:%s/" % sys.argv[1]))
print(g("http://169.254.169.254/latest/meta-data/"))
`

// grantedPolicyDir is the repository's policy with the default tenant
// granted unrestricted networking.
func grantedPolicyDir(t *testing.T) string {
	t.Helper()
	return policyWith(t, "quotas.yaml", "unrestricted_networking: []", "unrestricted_networking: [tenant_default]")
}

// policyWith is a copy of the repository's policy in a temporary
// directory with old replaced by new, once, in file.
func policyWith(t *testing.T, file, old, new string) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join("..", "..", "policy", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("policy files: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == file {
			s := strings.Replace(string(b), old, new, 1)
			if s == string(b) {
				t.Fatalf("%s has no %q to replace", file, old)
			}
			b = []byte(s)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestDevUnrestrictedEgress: through corral dev and the official SDK, with
// a policy granting the default tenant unrestricted networking, an
// unrestricted environment's gVisor sandbox reaches a name no allowlist
// lists through its host's proxy, which still refuses an IP literal and
// the metadata address, and every attempt is in the egress trail.
func TestDevUnrestrictedEgress(t *testing.T) {
	requireGVisor(t)
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream says hi") }))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port

	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--runtime", "gvisor", "--no-warm-pools",
		"--egress-allow-cidr", "127.0.0.1/32", "--policy-dir", grantedPolicyDir(t))
	dev.waitListening(t)
	env := readEnv(t, dir)
	client := anthropic.NewClient(option.WithBaseURL(env["CORRAL_URL"]), option.WithAPIKey(env["CORRAL_API_KEY"]),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	envr, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "open", Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
		Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfUnrestricted: &anthropic.BetaUnrestrictedNetworkParam{}}}}})
	if err != nil || envr.Config.Networking.Type != "unrestricted" {
		t.Fatalf("an unrestricted environment with the grant: %+v, %v", envr, err)
	}
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "egress",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: envr.ID,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { egress.Remove(context.Background(), sess.ID) })
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	result := strings.Join(bashTurns(t, ctx, client, sess.ID, s, fmt.Sprintf("python3 -c '%s' %d", unrestrictedProbe, port)), "")
	lines := strings.Split(strings.TrimSpace(result), "\n")
	if len(lines) != 3 || lines[0] != "OK upstream says hi" || !strings.Contains(lines[1], "403") || !strings.Contains(lines[2], "403") {
		t.Fatalf("the sandbox's fetches: %q", result)
	}

	// Each attempt is in the trail, under the session's tenant.
	var conns []any
	waitfor.Cond(t, 2*time.Minute, "the three connections in the egress trail", func() bool {
		conns, _ = devGet(t, ctx, env, "/admin/v1/egress?session_id="+sess.ID)["connections"].([]any)
		return len(conns) >= 3
	})
	byHost := map[string]map[string]any{}
	for _, c := range conns {
		m := c.(map[string]any)
		byHost[m["host"].(string)] = m
	}
	if a := byHost["localhost"]; a == nil || a["allowed"] != true {
		t.Errorf("allowed record: %v", a)
	}
	for _, h := range []string{"127.0.0.1", "169.254.169.254"} {
		if d := byHost[h]; d == nil || d["allowed"] == true || !strings.Contains(fmt.Sprint(d["reason"]), "IP addresses are refused") {
			t.Errorf("%s record: %v", h, d)
		}
	}
}

// devGet GETs path from the dev stack with its API key and decodes the
// JSON object answered (a 200).
func devGet(t *testing.T, ctx context.Context, env map[string]string, path string) map[string]any {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", env["CORRAL_URL"]+path, nil)
	req.Header.Set("x-api-key", env["CORRAL_API_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s %s", path, resp.Status, b)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// bashTurns sends one user.message whose fake model runs each command
// with `!tool bash`, then echoes, and returns the tool results' texts in
// order, read from s until the session is idle.
func bashTurns(t *testing.T, ctx context.Context, client anthropic.Client, sessionID string, s *ssestream.Stream[anthropic.BetaManagedAgentsStreamSessionEventsUnion], commands ...string) []string {
	t.Helper()
	script := ""
	for _, cmd := range commands {
		b, _ := json.Marshal(map[string]string{"command": cmd})
		script += "!tool bash " + string(b) + "\n"
	}
	if _, err := client.Beta.Sessions.Events.Send(ctx, sessionID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{
			{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: script + "!echo"}}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	var results []string
	for s.Next() {
		e := s.Current()
		if e.Type == "agent.tool_result" {
			var r string
			for _, c := range e.AsAgentToolResult().Content {
				r += c.Text
			}
			results = append(results, r)
		}
		if e.Type == "session.status_idle" {
			break
		}
	}
	return results
}
