package tools_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tools"
)

// The loop scenario is the scenario through the agent loop, the fake
// model and a real host agent: python3 prints 42 and the
// answer goes to /workspace/out.txt; a second turn reads it back; an
// always_ask tool waits for approval. Every event decodes with the official
// SDK. It runs on the process driver and in gVisor with the Debian image.
func TestLoopScenarioProcess(t *testing.T) { loopScenario(t, processHost(t).Sandbox()) }

func TestLoopScenarioGVisor(t *testing.T) { loopScenario(t, gvisorHost(t).Sandbox()) }

func loopScenario(t *testing.T, sb tools.Sandbox) {
	st := looptest.NewMemStore()
	var agent agentloop.Agent
	agent.Model.ID = "fake"
	agent.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset, Configs: []agentloop.ToolConfig{
		{Name: "edit", PermissionPolicy: &agentloop.Policy{Type: "always_ask"}},
	}}}
	st.CreateSession("sesn_1", agent)
	placed := 0
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, NewID: looptest.NewID,
		Tools: tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { placed++; return sb, nil }, agentloop.ExecLimits{})}
	send := func(event map[string]any) {
		t.Helper()
		event["id"] = looptest.NewID()
		b, _ := json.Marshal(event)
		if err := st.AddUserEvent("sesn_1", b); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := r.Run(ctx, "sesn_1"); err != nil {
			t.Fatal(err)
		}
	}
	say := func(text string) {
		t.Helper()
		send(map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": text}}})
	}
	// results decodes every event with the SDK and returns the tool
	// results' texts from event n on.
	decoded := func(n int) (uses []anthropic.BetaManagedAgentsAgentToolUseEvent, results []anthropic.BetaManagedAgentsAgentToolResultEvent) {
		t.Helper()
		for _, raw := range st.RawEvents("sesn_1")[n:] {
			var e anthropic.BetaManagedAgentsSessionEventUnion
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatalf("the SDK cannot decode %s: %v", raw, err)
			}
			switch e.Type {
			case "agent.tool_use":
				uses = append(uses, e.AsAgentToolUse())
			case "agent.tool_result":
				results = append(results, e.AsAgentToolResult())
			}
		}
		return uses, results
	}

	// (No semicolons: the fake model's script splits tool calls on them.)
	say(`!tool bash {"command":"python3 -c 'print(6*7)' | tee out.txt && python3 -c 'print(6*7)' >&2"}` + "\n!echo")
	uses, results := decoded(0)
	if len(uses) != 1 || uses[0].Name != "bash" || uses[0].EvaluatedPermission != "allow" || len(results) != 1 {
		t.Fatalf("first turn: %d uses, %d results", len(uses), len(results))
	}
	if res := results[0]; res.ToolUseID != uses[0].ID || res.IsError || res.Content[0].Text != "42\n42" {
		t.Fatalf("bash result %+v", res)
	}
	if placed != 1 {
		t.Errorf("the sandbox was asked for %d times, want 1", placed)
	}

	n := len(st.RawEvents("sesn_1"))
	say(`!tool read {"file_path":"/workspace/out.txt"}` + "\n!echo")
	_, results = decoded(n)
	if len(results) != 1 || results[0].IsError || results[0].Content[0].Text != "     1\t42\n" {
		t.Fatalf("second turn: %+v", results)
	}

	n = len(st.RawEvents("sesn_1"))
	say(`!tool edit {"file_path":"out.txt","old_string":"42","new_string":"forty-two"}` + "\n!echo")
	uses, results = decoded(n)
	if len(uses) != 1 || uses[0].EvaluatedPermission != "ask" || len(results) != 0 || st.Status("sesn_1") != "idle" {
		t.Fatalf("always_ask edit: %d uses (%+v), %d results, status %s", len(uses), uses, len(results), st.Status("sesn_1"))
	}
	if got, _ := sb.ReadFile(context.Background(), "out.txt"); string(got) != "42\n" {
		t.Fatalf("the file changed before approval: %q", got)
	}
	send(map[string]any{"type": "user.tool_confirmation", "tool_use_id": uses[0].ID, "result": "allow"})
	_, results = decoded(n)
	if len(results) != 1 || results[0].IsError || !strings.Contains(results[0].Content[0].Text, "Replaced 1 occurrence") {
		t.Fatalf("approved edit: %+v", results)
	}
	if got, _ := sb.ReadFile(context.Background(), "out.txt"); string(got) != "forty-two\n" {
		t.Fatalf("after the approved edit: %q", got)
	}

	// A bad input is a tool result; the session goes on.
	n = len(st.RawEvents("sesn_1"))
	say(`!tool read {"file_path":"/etc/passwd"}` + "\n!echo")
	_, results = decoded(n)
	if len(results) != 1 || !results[0].IsError || !strings.Contains(results[0].Content[0].Text, "outside the workspace") || st.Status("sesn_1") != "idle" {
		t.Fatalf("path escape: %+v, status %s", results, st.Status("sesn_1"))
	}
}

// TestCancelStopsTheCommand: when the loop's context ends (an interrupt, a
// shutdown), a running command is killed and the sandbox stays usable.
func TestCancelStopsTheCommand(t *testing.T) {
	sb := processHost(t).Sandbox()
	r := tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := r.Run(ctx, "s", agentloop.ToolCall{Name: "bash", Input: []byte(`{"command":"sleep 600"}`)})
	if err == nil || time.Since(start) > 30*time.Second {
		t.Fatalf("cancelled sleep 600: %v after %s", err, time.Since(start))
	}
	res, err := r.Run(context.Background(), "s", agentloop.ToolCall{Name: "bash", Input: []byte(`{"command":"echo alive"}`)})
	if err != nil || res.Content[0].Text != "alive" {
		t.Fatalf("after the cancel: %+v, %v", res, err)
	}
}
