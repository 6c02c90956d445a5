package tools_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/waitfor"
)

func TestHandOverProcess(t *testing.T) { handOver(t, processHost(t).Sandbox()) }

func TestHandOverGVisor(t *testing.T) { handOver(t, gvisorHost(t).Sandbox()) }

// handOver: a runner stops mid-command handing the session over; a new
// runner (another node, after a failover) makes the same call and gets the
// command's result without running it again.
func handOver(t *testing.T, sb tools.Sandbox) {
	newToolset := func() *tools.Toolset {
		return tools.NewToolset(func(context.Context, string) (tools.Sandbox, error) { return sb, nil }, agentloop.ExecLimits{})
	}
	// (No semicolons: the fake model's script splits on them; && as the
	// loop would get it.)
	call := agentloop.ToolCall{EventID: "sevt_use1", Name: "bash",
		Input: []byte(`{"command":"echo start >> log && while [ ! -e go ]\ndo sleep 0.05\ndone\necho done >> log && cat log"}`)}

	ctx1, stop1 := context.WithCancelCause(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := newToolset().Run(ctx1, "sesn_1", call)
		first <- err
	}()
	waitFile(t, sb, "log", "start\n")
	stop1(agentloop.ErrHandOver)
	if err := <-first; err == nil {
		t.Fatal("the stopped runner got a result")
	}

	second := make(chan agentloop.ToolResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := newToolset().Run(ctx, "sesn_1", call)
		if err != nil {
			t.Errorf("the new runner: %v", err)
		}
		second <- res
	}()
	if err := sb.WriteFile(context.Background(), "go", nil, 0); err != nil {
		t.Fatal(err)
	}
	res := <-second
	if res.IsError || len(res.Content) != 1 || res.Content[0].Text != "start\ndone" {
		t.Fatalf("the new runner's result: %+v", res)
	}
	waitFile(t, sb, "log", "start\ndone\n")

	// Any other end of the context (an interrupt) kills the command: the
	// same call asked again does not run it either.
	sleeper := agentloop.ToolCall{EventID: "sevt_use2", Name: "bash", Input: []byte(`{"command":"echo slept >> log2 && sleep 600"}`)}
	ctx2, stop2 := context.WithCancel(context.Background())
	killed := make(chan error, 1)
	go func() {
		_, err := newToolset().Run(ctx2, "sesn_1", sleeper)
		killed <- err
	}()
	waitFile(t, sb, "log2", "slept\n")
	stop2()
	if err := <-killed; err == nil {
		t.Fatal("the interrupted runner got a result")
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel3()
	start := time.Now()
	if _, err := newToolset().Run(ctx3, "sesn_1", sleeper); err == nil || !strings.Contains(err.Error(), "cancel") || time.Since(start) > 30*time.Second {
		t.Fatalf("asking again for the killed command: %v after %s", err, time.Since(start))
	}
	waitFile(t, sb, "log2", "slept\n")

	// CancelTool, from another runner (the node that took an interrupted
	// session over), kills a command a runner elsewhere still waits for.
	third := agentloop.ToolCall{EventID: "sevt_use3", Name: "bash", Input: []byte(`{"command":"echo slept >> log3 && sleep 600"}`)}
	waiting := make(chan error, 1)
	go func() {
		_, err := newToolset().Run(context.Background(), "sesn_1", third)
		waiting <- err
	}()
	waitFile(t, sb, "log3", "slept\n")
	if err := newToolset().CancelTool(ctx3, "sesn_1", third); err != nil {
		t.Fatal(err)
	}
	if err := waitfor.Chan(t, time.Minute, "CancelTool to stop the command", waiting); err == nil || !strings.Contains(err.Error(), "cancel") {
		t.Fatalf("the toolset waiting for a canceled command: %v", err)
	}
}

// waitFile waits until the workspace file holds want.
func waitFile(t *testing.T, sb tools.Sandbox, path, want string) {
	t.Helper()
	waitfor.State(t, time.Minute, fmt.Sprintf("%s to hold %q", path, want), func() (bool, string) {
		got, err := sb.ReadFile(context.Background(), path)
		return string(got) == want, fmt.Sprintf("%q, %v", got, err)
	})
}
