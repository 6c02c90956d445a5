package agentloop_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/internal/errdefs"
)

// flakyTools fails its first calls with err, then answers.
type flakyTools struct {
	mu sync.Mutex
	// Fields below guarded by mu.
	fails int // calls left to fail
	err   error
	calls int
}

func (f *flakyTools) Run(_ context.Context, _ string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fails != 0 {
		f.fails--
		return agentloop.ToolResult{}, f.err
	}
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: c.Name + " ok"}}}, nil
}

func (f *flakyTools) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// toolTurn runs one turn that calls bash once, with tools, and returns the
// turn's events.
func toolTurn(t *testing.T, tools agentloop.Toolbox, retries int) []agentloop.Event {
	t.Helper()
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, toolAgent())
	r := &agentloop.Loop{Store: ms, Model: model.Fake{}, Tools: tools, NewID: looptest.NewID,
		ToolRetries: retries, ToolBackoff: func(int) time.Duration { return 0 }}
	say(t, h, id, "!tool bash {}\n!echo")
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	return ms.Events(id)
}

func count(log []agentloop.Event, typ string) int {
	n := 0
	for _, e := range log {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// A tool call that fails with a transient error (the sandbox lock's
// database restarting, a host's stream cut) is tried again within the
// step; the turn sees only its result.
func TestToolTransientErrorIsRetried(t *testing.T) {
	tools := &flakyTools{fails: 2, err: errdefs.Unavailable("locking the sandbox of session s: connection refused")}
	log := toolTurn(t, tools, 0)
	if n := count(log, agentloop.AgentToolResult); n != 1 {
		t.Errorf("%d tool results, want 1", n)
	}
	if n := count(log, agentloop.SessionError); n != 0 {
		t.Errorf("%d session errors, want none", n)
	}
	if got := tools.count(); got != 3 {
		t.Errorf("the tool was called %d times, want 3", got)
	}
	if last := log[len(log)-1]; last.StopReason == nil || last.StopReason.Type != "end_turn" {
		t.Errorf("the turn ended with %+v", last)
	}
}

// A transient error that outlasts the retries ends the turn with a
// session.error that says so.
func TestToolTransientErrorRetriesRunOut(t *testing.T) {
	tools := &flakyTools{fails: -1, err: errdefs.Unavailable("the host's stream ended")}
	log := toolTurn(t, tools, 0)
	if got := tools.count(); got != 5 {
		t.Errorf("the tool was called %d times, want 5 (the default: 4 retries)", got)
	}
	if n := count(log, agentloop.AgentToolResult); n != 0 {
		t.Errorf("%d tool results, want none", n)
	}
	e := errorOf(t, log)
	// The host's words stay in the log; the tenant learns what it can act on.
	if e.RetryStatus.Type != "exhausted" || !strings.Contains(e.Message, "unavailable") || !strings.Contains(e.Message, "tried 5 times") || strings.Contains(e.Message, "stream ended") {
		t.Errorf("session.error %+v", e)
	}
}

// Other errors are not retried: they end the turn at once.
func TestToolOtherErrorIsNotRetried(t *testing.T) {
	for name, err := range map[string]error{
		"plain":             errors.New("no sandbox"),
		"resource":          errdefs.ResourceExhausted("no sandbox capacity"),
		"deadline exceeded": errdefs.Wrap(errdefs.DeadlineExceededKind, context.DeadlineExceeded, "the sandbox did not become ready"),
	} {
		tools := &flakyTools{fails: -1, err: err}
		log := toolTurn(t, tools, 3)
		if got := tools.count(); got != 1 {
			t.Errorf("%s: the tool was called %d times, want 1", name, got)
		}
		if e := errorOf(t, log); e.RetryStatus.Type != "exhausted" || strings.Contains(e.Message, "tried") {
			t.Errorf("%s: session.error %+v", name, e)
		}
	}
}

// A loop stopped while it waits to retry stops at once, reporting
// nothing: the next runner tries the call again.
func TestToolRetryStopsWithTheLoop(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, toolAgent())
	failed := make(chan struct{}, 1)
	tools := toolRunnerFunc(func(context.Context, string, agentloop.ToolCall) (agentloop.ToolResult, error) {
		failed <- struct{}{}
		return agentloop.ToolResult{}, errdefs.Unavailable("database restarting")
	})
	r := &agentloop.Loop{Store: ms, Model: model.Fake{}, Tools: tools, NewID: looptest.NewID,
		ToolBackoff: func(int) time.Duration { return time.Hour }}
	say(t, h, id, "!tool bash {}")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, id) }()
	<-failed
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run ended with %v, want context.Canceled", err)
	}
	if n := count(ms.Events(id), agentloop.SessionError); n != 0 {
		t.Fatalf("%d session errors after the loop stopped", n)
	}
}

type errorInfo struct {
	Message     string `json:"message"`
	RetryStatus struct {
		Type string `json:"type"`
	} `json:"retry_status"`
}

// errorOf returns the error of the log's one session.error.
func errorOf(t *testing.T, log []agentloop.Event) errorInfo {
	t.Helper()
	var out []errorInfo
	for _, e := range log {
		if e.Type == agentloop.SessionError {
			var ei errorInfo
			if err := json.Unmarshal(e.Error, &ei); err != nil {
				t.Fatal(err)
			}
			out = append(out, ei)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d session errors, want 1", len(out))
	}
	return out[0]
}
