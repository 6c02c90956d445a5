package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/test/mcpserver"
	"corral.dev/corral/test/mirrortest"
)

// packagesProbe runs in a session's sandbox: the apt package's program and
// the pip package's module, each saying whether it is there. (No
// semicolons: the fake model's script splits on them.)
const packagesProbe = `corral-hello || echo no-apt-package
python3 -c 'import corralpkg, sys
sys.stdout.write(corralpkg.VALUE + "\n")' || echo no-pip-package`

// TestDevEnvironmentPackages: through corral dev and the official SDK, an
// environment's packages (apt and pip, from mirrors this test serves on
// loopback) are built once into an image in a gVisor build sandbox that
// reaches only the mirrors; its sessions run that image, the second
// without a rebuild; the build is visible through the admin API and
// `corral builds ls`; an update builds a new image for new sessions only;
// and a package the mirror lacks fails the build, which the session's
// tool call and the build's record say.
func TestDevEnvironmentPackages(t *testing.T) {
	requireGVisor(t)
	mirrors := mirrortest.Serve(t)
	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	// The images the builds make stay on the host; this run's have names
	// of their own (the mirrors' ports are in their keys): removed at the
	// end, after corral dev.
	built := map[string]bool{}
	containerdtest.RemoveBuiltImages(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor}, func() []string {
		return slices.Collect(maps.Keys(built))
	})
	grpcAddr := freeAddr(t)
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", grpcAddr, "--runtime", "gvisor", "--no-warm-pools",
		"--egress-allow-cidr", "127.0.0.1/32", "--package-mirror", "apt="+mirrors.APT, "--package-mirror", "pip="+mirrors.Pip,
		"--package-mirror", "npm="+mirrors.Npm, "--policy-dir", nodeClassPolicy(t),
		"--mcp-allow-private-networks") // the agent's MCP server below is on loopback
	dev.waitListening(t)
	env := readEnv(t, dir)
	// A session's first tool call waits for the build: the stream's
	// request may last that long.
	client := anthropic.NewClient(option.WithBaseURL(env["CORRAL_URL"]), option.WithAPIKey(env["CORRAL_API_KEY"]),
		option.WithRequestTimeout(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	envr, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "with-packages",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Packages: anthropic.BetaPackagesParams{Apt: []string{mirrortest.AptPackage}, Pip: []string{mirrortest.PipPackage}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if p := envr.Config.Packages; fmt.Sprint(p.Apt, p.Pip) != fmt.Sprintf("[%s] [%s]", mirrortest.AptPackage, mirrortest.PipPackage) {
		t.Fatalf("the environment reports packages %s", envr.Config.Packages.RawJSON())
	}
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "packages",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	newSession := func(envID string) string {
		t.Helper()
		sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: envID,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { egress.Remove(context.Background(), sess.ID) })
		return sess.ID
	}
	probe := func(sessionID string) string {
		t.Helper()
		return probeWith(t, ctx, client, sessionID, packagesProbe)
	}
	builds := func(envID string) []map[string]any {
		t.Helper()
		var out []map[string]any
		list, _ := devGet(t, ctx, env, "/admin/v1/builds?environment_id="+envID)["builds"].([]any)
		for _, b := range list {
			m := b.(map[string]any)
			if img, _ := m["image"].(string); img != "" {
				built[img] = true
			}
			out = append(out, m)
		}
		return out
	}

	// The first session's tool call waits for the build and runs both
	// packages.
	first := newSession(envr.ID)
	start := time.Now()
	if out := probe(first); !strings.Contains(out, mirrortest.HelloOutput) || !strings.Contains(out, mirrortest.PipValue) {
		t.Fatalf("the first session's sandbox: %q", out)
	}
	t.Logf("session create to first tool result, build included: %v", time.Since(start).Round(100*time.Millisecond))
	b := builds(envr.ID)
	if len(b) != 1 || b[0]["status"] != "ready" || b[0]["attempts"] != float64(1) || b[0]["environment_id"] != envr.ID || !strings.Contains(fmt.Sprint(b[0]["log"]), "corral-hello") {
		t.Fatalf("the environment's build: %v", b)
	}
	key := b[0]["key"].(string)
	debs, wheels := mirrors.Downloads()
	if debs != 1 || wheels != 1 {
		t.Fatalf("the build fetched the .deb %d times and the wheel %d times", debs, wheels)
	}

	// A second session runs the same image: nothing is built or fetched
	// again.
	second := newSession(envr.ID)
	if out := probe(second); !strings.Contains(out, mirrortest.HelloOutput) || !strings.Contains(out, mirrortest.PipValue) {
		t.Fatalf("the second session's sandbox: %q", out)
	}
	if b := builds(envr.ID); len(b) != 1 || b[0]["key"] != key || b[0]["attempts"] != float64(1) {
		t.Fatalf("after the second session: %v", b)
	}
	if d, w := mirrors.Downloads(); d != debs || w != wheels {
		t.Fatalf("the second session fetched packages again: .deb %d, wheel %d", d, w)
	}
	out, err := exec.Command(corralBin, "builds", "ls", "--server", grpcAddr, "--api-key", env["CORRAL_API_KEY"], "--environment", envr.ID).CombinedOutput()
	if err != nil || !strings.Contains(string(out), key[:12]) || !strings.Contains(string(out), "ready") {
		t.Fatalf("corral builds ls: %v\n%s", err, out)
	}
	t.Logf("corral builds ls:\n%s", out)

	// An update that drops the pip package builds anew for new sessions;
	// the sessions made before keep the image they run.
	if _, err := client.Beta.Environments.Update(ctx, envr.ID, anthropic.BetaEnvironmentUpdateParams{
		Config: anthropic.BetaEnvironmentUpdateParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Packages: anthropic.BetaPackagesParams{Apt: []string{mirrortest.AptPackage}}}}}); err != nil {
		t.Fatal(err)
	}
	third := newSession(envr.ID)
	if out := probe(third); !strings.Contains(out, mirrortest.HelloOutput) || !strings.Contains(out, "no-pip-package") {
		t.Fatalf("a session after the update: %q", out)
	}
	if b := builds(envr.ID); len(b) != 1 || b[0]["key"] == key || b[0]["status"] != "ready" {
		t.Fatalf("the updated environment's build: %v", b)
	}
	if out := probe(first); !strings.Contains(out, mirrortest.PipValue) {
		t.Fatalf("the first session after the update: %q", out)
	}

	// npm packages, in an environment whose class's image has npm (the
	// Debian image does not).
	nodeEnv, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "with-npm",
		Metadata: map[string]string{"corral.sandbox_class": "node"},
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Packages: anthropic.BetaPackagesParams{Npm: []string{mirrortest.NpmPackage}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if out := probeWith(t, ctx, client, newSession(nodeEnv.ID), mirrortest.NpmPackage); !strings.Contains(out, mirrortest.NpmOutput) {
		t.Fatalf("a session of the npm environment: %q", out)
	}
	if b := builds(nodeEnv.ID); len(b) != 1 || b[0]["status"] != "ready" || b[0]["base_image"] != nodeImage {
		t.Fatalf("the npm environment's build: %v", b)
	}
	if n := mirrors.NpmDownloads(); n != 1 {
		t.Fatalf("the npm tarball was fetched %d times", n)
	}

	// A package the mirror does not have fails the build: the session's
	// tool call says so, and so does the build's record.
	bad, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "missing-package",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Packages: anthropic.BetaPackagesParams{Apt: []string{"corral-no-such-package"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var failed []map[string]any
	waitfor.Cond(t, 10*time.Minute, "the failing build to end", func() bool {
		failed = builds(bad.ID)
		return len(failed) == 1 && failed[0]["status"] == "failed"
	})
	if e := fmt.Sprint(failed[0]["error"]); !strings.Contains(e, "apt") || !strings.Contains(e, "corral-no-such-package") {
		t.Fatalf("the failed build's error: %q", e)
	}
	if out := turnError(t, ctx, client, newSession(bad.ID), packagesProbe); !strings.Contains(out, "packages failed to build") || !strings.Contains(out, "corral-no-such-package") {
		t.Fatalf("a session of the failed environment: %q", out)
	}

	// allow_package_managers lets a session's sandbox reach the mirrors
	// (and nothing else: its allowlist is theirs).
	pm, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "package-managers",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfLimited: &anthropic.BetaLimitedNetworkParams{AllowPackageManagers: anthropic.Bool(true)}}}}})
	if err != nil || !pm.Config.Networking.AllowPackageManagers {
		t.Fatalf("allow_package_managers with mirrors: %+v, %v", pm, err)
	}
	fetch := fmt.Sprintf(`python3 -c 'import urllib.request as u, sys
def g(x):
    try:
        return "OK %%d" %% u.urlopen(x, timeout=20).status
    except Exception as e:
        return "ERR " + str(e)
print(g(sys.argv[1]))
print(g("http://denied.example/"))' %s`, mirrors.Pip)
	if out := probeWith(t, ctx, client, newSession(pm.ID), fetch); !strings.HasPrefix(out, "OK 200\n") || !strings.Contains(out, "403") {
		t.Fatalf("a sandbox allowed package managers: %q", out)
	}

	// allow_mcp_servers lets a session's sandbox reach its agent's MCP
	// servers' hosts (a server on this machine's loopback, named
	// localhost) and no other.
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.New())
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "mcp here") })
	mcpSrv := httptest.NewServer(mux)
	defer mcpSrv.Close()
	mcpHost := fmt.Sprintf("localhost:%d", mcpSrv.Listener.Addr().(*net.TCPAddr).Port)
	mcpEnv, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "mcp-servers",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{OfLimited: &anthropic.BetaLimitedNetworkParams{AllowMCPServers: anthropic.Bool(true)}}}}})
	if err != nil || !mcpEnv.Config.Networking.AllowMCPServers {
		t.Fatalf("allow_mcp_servers: %+v, %v", mcpEnv, err)
	}
	mcpAgent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "with-mcp",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}},
			{OfMCPToolset: &anthropic.BetaManagedAgentsMCPToolsetParams{MCPServerName: "docs"}}},
		MCPServers: []anthropic.BetaManagedAgentsURLMCPServerParams{{Name: "docs", URL: "http://" + mcpHost + "/mcp"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mcpSess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(mcpAgent.ID)}, EnvironmentID: mcpEnv.ID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { egress.Remove(context.Background(), mcpSess.ID) })
	fetchMCP := fmt.Sprintf(`python3 -c 'import urllib.request as u, sys
def g(x):
    try:
        return "OK " + u.urlopen(x, timeout=20).read().decode()
    except Exception as e:
        return "ERR " + str(e)
print(g(sys.argv[1]))
print(g("http://denied.example/"))' http://%s/hello`, mcpHost)
	if out := probeWith(t, ctx, client, mcpSess.ID, fetchMCP); !strings.HasPrefix(out, "OK mcp here\n") || !strings.Contains(out, "403") {
		t.Fatalf("a sandbox allowed its agent's MCP servers: %q", out)
	}

	// Packages of a manager without a mirror are refused before anything
	// is stored.
	_, err = client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "cargo",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{
			Packages: anthropic.BetaPackagesParams{Cargo: []string{"ripgrep"}}}}})
	if err == nil || !strings.Contains(err.Error(), "no cargo package mirror") || !strings.Contains(err.Error(), "configured: apt, npm, pip") {
		t.Fatalf("cargo packages without a cargo mirror: %v", err)
	}
}

// probeWith runs one bash command in a session and returns its result.
func probeWith(t *testing.T, ctx context.Context, client anthropic.Client, sessionID, command string) string {
	t.Helper()
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sessionID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	return strings.Join(bashTurns(t, ctx, client, sessionID, s, command), "")
}

// turnError runs one bash command in a session whose sandbox cannot be
// had, and returns the session.error that ends the turn (its JSON).
func turnError(t *testing.T, ctx context.Context, client anthropic.Client, sessionID, command string) string {
	t.Helper()
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sessionID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	b, _ := json.Marshal(map[string]string{"command": command})
	if _, err := client.Beta.Sessions.Events.Send(ctx, sessionID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{
		{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{
			{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: "!tool bash " + string(b)}}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	for s.Next() {
		e := s.Current()
		switch e.Type {
		case "session.error":
			return e.RawJSON()
		case "agent.tool_result":
			t.Fatalf("the turn ran its tool: %s", e.RawJSON())
		case "session.status_idle":
			t.Fatal("the turn ended without a session.error")
		}
	}
	t.Fatalf("the stream ended: %v", s.Err())
	return ""
}

// nodeImage is the Debian image with nodejs and npm (scripts/runtime).
const nodeImage = "localhost/corral/debian-node:bookworm-1"

// nodeClassPolicy is the repository's policy with a sandbox class node:
// gVisor sandboxes of nodeImage.
func nodeClassPolicy(t *testing.T) string {
	t.Helper()
	return policyWith(t, "classes.yaml", "\nsandbox_classes:\n",
		"\nsandbox_classes:\n  node:\n    description: gVisor sandboxes with node and npm\n    runtime: gvisor\n    image: "+nodeImage+"\n    network_modes: [none, limited]\n")
}
