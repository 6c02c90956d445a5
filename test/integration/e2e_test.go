package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
)

// sessionContainers lists the containers the gVisor driver made for a
// session, through ctr on the private containerd (namespace corral, the
// driver's default).
func sessionContainers(t *testing.T, sessionID string) []string {
	t.Helper()
	out, err := exec.Command("/var/cache/corral/bin/ctr", "--address", strings.TrimPrefix(containerdAddress(), "unix://"),
		"-n", "corral", "containers", "ls", "-q", `labels."corral.key"==`+sessionID).Output()
	if err != nil {
		t.Fatalf("ctr containers ls: %v", err)
	}
	return strings.Fields(string(out))
}

// TestDevSessionRunsToolsInGVisor is issue 6's "done when", through the
// official Go SDK against `corral dev` with the gVisor runtime: an agent
// with the toolset; python3 answers 42 into /workspace/out.txt (the stream
// shows the tool use and its result); a second turn reads the file back;
// an always_ask tool waits for approval; an interrupt stops a `sleep 600`;
// deleting the session removes its container from the host.
func TestDevSessionRunsToolsInGVisor(t *testing.T) {
	requireGVisor(t)
	dir := dataDir(t)
	// corral dev is killed at the end: its host's sandboxes are swept after.
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t), "--runtime", "gvisor")
	dev.waitListening(t)
	env := readEnv(t, dir)
	client := anthropic.NewClient(option.WithBaseURL(env["CORRAL_URL"]), option.WithAPIKey(env["CORRAL_API_KEY"]),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "e2e",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{
			Configs: []anthropic.BetaManagedAgentsAgentToolConfigParamsUnion{{OfEdit: &anthropic.BetaManagedAgentsEditToolConfigParams{
				PermissionPolicy: anthropic.BetaManagedAgentsEditToolConfigParamsPermissionPolicyUnion{OfAlwaysAsk: &anthropic.BetaManagedAgentsAlwaysAskPolicyParam{}},
			}}},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	envr, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: envr.ID,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	send := func(evs ...anthropic.BetaManagedAgentsEventParamsUnion) {
		t.Helper()
		if _, err := client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{Events: evs}); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	say := func(text string) {
		t.Helper()
		send(anthropic.BetaManagedAgentsEventParamsUnion{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{
			Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: text}}},
		}})
	}
	// until reads the stream up to an event of type typ.
	until := func(typ string) []anthropic.BetaManagedAgentsStreamSessionEventsUnion {
		t.Helper()
		var got []anthropic.BetaManagedAgentsStreamSessionEventsUnion
		for s.Next() {
			got = append(got, s.Current())
			if s.Current().Type == typ {
				return got
			}
		}
		t.Fatalf("the stream ended before %s (after %d events): %v", typ, len(got), s.Err())
		return nil
	}
	results := func(evs []anthropic.BetaManagedAgentsStreamSessionEventsUnion) (uses []anthropic.BetaManagedAgentsAgentToolUseEvent, texts []string) {
		for _, e := range evs {
			switch e.Type {
			case "agent.tool_use":
				uses = append(uses, e.AsAgentToolUse())
			case "agent.tool_result":
				var b strings.Builder
				for _, c := range e.AsAgentToolResult().Content {
					b.WriteString(c.Text)
				}
				texts = append(texts, b.String())
			}
		}
		return uses, texts
	}

	// Python in the sandbox answers into /workspace/out.txt. (No
	// semicolons: the fake model's script splits on them.)
	start := time.Now()
	say(`!tool bash {"command":"python3 -c 'print(6*7)' > /workspace/out.txt && cat /workspace/out.txt"}` + "\n!echo")
	uses, texts := results(until("session.status_idle"))
	if len(uses) != 1 || uses[0].Name != "bash" || len(texts) != 1 || strings.TrimSpace(texts[0]) != "42" {
		t.Fatalf("first turn: uses %+v, results %q", uses, texts)
	}
	t.Logf("first turn (a cold gVisor sandbox, python3) in %v", time.Since(start))

	// A second turn reads it back.
	say(`!tool read {"file_path":"/workspace/out.txt"}` + "\n!echo")
	if _, texts = results(until("session.status_idle")); len(texts) != 1 || !strings.Contains(texts[0], "42") {
		t.Fatalf("reading back: %q", texts)
	}

	// always_ask: the edit waits for a confirmation before it runs.
	say(`!tool edit {"file_path":"/workspace/out.txt","old_string":"42","new_string":"forty-two"}` + "\n!echo")
	turn := until("session.status_idle")
	uses, texts = results(turn)
	idle := turn[len(turn)-1].AsSessionStatusIdle()
	if len(uses) != 1 || uses[0].EvaluatedPermission != "ask" || len(texts) != 0 || idle.StopReason.Type != "requires_action" {
		t.Fatalf("always_ask edit: uses %+v, results %q, stop %s", uses, texts, idle.StopReason.Type)
	}
	send(anthropic.BetaManagedAgentsEventParamsUnion{OfUserToolConfirmation: &anthropic.BetaManagedAgentsUserToolConfirmationEventParams{
		ToolUseID: uses[0].ID, Result: "allow",
	}})
	if _, texts = results(until("session.status_idle")); len(texts) != 1 || !strings.Contains(texts[0], "Replaced 1") {
		t.Fatalf("approved edit: %q", texts)
	}
	say(`!tool bash {"command":"cat /workspace/out.txt"}` + "\n!echo")
	if _, texts = results(until("session.status_idle")); len(texts) != 1 || strings.TrimSpace(texts[0]) != "forty-two" {
		t.Fatalf("after the approved edit: %q", texts)
	}

	// An interrupt stops a running sleep 600: the turn ends at once and
	// the sandbox is free for the next command.
	say(`!tool bash {"command":"echo sleeping > /workspace/sleep.txt && sleep 600"}` + "\n!echo")
	until("agent.tool_use")
	cids := sessionContainers(t, sess.ID)
	if len(cids) != 1 {
		t.Fatalf("%d containers for the session, want 1", len(cids))
	}
	waitfor.Cond(t, time.Minute, "sleep 600 to run in the sandbox", func() bool {
		out, _ := exec.Command("/var/cache/corral/bin/ctr", "--address", strings.TrimPrefix(containerdAddress(), "unix://"),
			"-n", "corral", "tasks", "exec", "--exec-id", fmt.Sprintf("e2e-%d", time.Now().UnixNano()), cids[0],
			"cat", "/workspace/sleep.txt").Output()
		return strings.TrimSpace(string(out)) == "sleeping"
	})
	send(anthropic.BetaManagedAgentsEventParamsUnion{OfUserInterrupt: &anthropic.BetaManagedAgentsUserInterruptEventParams{}})
	start = time.Now()
	until("session.status_idle")
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("the interrupt took %v", d)
	}
	say(`!tool bash {"command":"cat /proc/[0-9]*/cmdline 2>/dev/null | tr -c '[:print:]' ' ' | grep -c '[s]leep 600' || true"}` + "\n!echo")
	if _, texts = results(until("session.status_idle")); len(texts) != 1 || strings.TrimSpace(texts[0]) != "0" {
		t.Fatalf("after the interrupt: %q (sleep 600 must be gone)", texts)
	}

	// Deleting the session removes its container.
	if n := len(sessionContainers(t, sess.ID)); n != 1 {
		t.Fatalf("%d containers for the session before delete, want 1", n)
	}
	if _, err := client.Beta.Sessions.Delete(ctx, sess.ID, anthropic.BetaSessionDeleteParams{}); err != nil {
		t.Fatal(err)
	}
	waitfor.Cond(t, 2*time.Minute, "the session's container to go", func() bool { return len(sessionContainers(t, sess.ID)) == 0 })
}
