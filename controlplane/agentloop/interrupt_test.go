package agentloop_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/internal/waitfor"
)

// blockingTools runs every call until its context ends, and records why it
// ended and which calls were canceled.
type blockingTools struct {
	started  chan string
	mu       sync.Mutex
	causes   []error
	canceled []string
}

func (b *blockingTools) Run(ctx context.Context, _ string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	b.started <- c.EventID
	<-ctx.Done()
	b.mu.Lock()
	b.causes = append(b.causes, context.Cause(ctx))
	b.mu.Unlock()
	return agentloop.ToolResult{}, ctx.Err()
}

func (b *blockingTools) CancelTool(_ context.Context, _ string, c agentloop.ToolCall) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.canceled = append(b.canceled, c.EventID)
	return nil
}

// An interrupt that arrives while a tool call runs ends the call at once
// (its context ends with ErrInterrupted), the turn ends, and the runner
// asks the tool runner to stop the call wherever it runs.
func TestInterruptStopsARunningTool(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	var a agentloop.Agent
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	id := h.CreateSession(t, a)
	tools := &blockingTools{started: make(chan string, 1)}
	r := &agentloop.Loop{Store: ms, Model: model.Fake{}, Tools: tools, NewID: looptest.NewID}
	pool := agentloop.NewPool(r, func(c context.Context, _ string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, nil)
	defer pool.Stop()
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": `!tool bash {"command":"sleep 600"}`}}})
	pool.Wake("tenant_1", id)
	use := waitfor.Chan(t, 30*time.Second, "the tool call to start", tools.started)
	h.Send(t, id, map[string]any{"type": "user.interrupt"})
	pool.Wake("tenant_1", id)

	waitfor.State(t, 30*time.Second, "the session to go idle after the interrupt", func() (bool, string) {
		st := ms.Status(id)
		return st == "idle", "status " + st
	})
	tools.mu.Lock()
	defer tools.mu.Unlock()
	if len(tools.causes) != 1 || tools.causes[0] != agentloop.ErrInterrupted {
		t.Fatalf("the tool call ended with %v, want ErrInterrupted", tools.causes)
	}
	if len(tools.canceled) != 1 || tools.canceled[0] != use {
		t.Fatalf("canceled %v, want the call %s", tools.canceled, use)
	}
	log := ms.Events(id)
	last := log[len(log)-1]
	if last.Type != agentloop.StatusIdle || last.StopReason == nil || last.StopReason.Type != "end_turn" {
		t.Fatalf("last event %+v", last)
	}
}
