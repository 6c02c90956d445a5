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

// countingStore counts the loop's reads, and fails the commits its
// failCommit says to (after applying them, when applied is set: the
// outcome of a commit whose reply was lost).
type countingStore struct {
	*looptest.MemStore
	mu sync.Mutex
	// Fields below guarded by mu.
	loads, sinces, commits int
	failCommit             func(n int, c agentloop.Commit) (fail, applied bool)
}

func (s *countingStore) Load(ctx context.Context, id string) (agentloop.Agent, []agentloop.Event, error) {
	s.mu.Lock()
	s.loads++
	s.mu.Unlock()
	return s.MemStore.Load(ctx, id)
}

func (s *countingStore) LoadSince(ctx context.Context, id string, after int64) ([]agentloop.Event, error) {
	s.mu.Lock()
	s.sinces++
	s.mu.Unlock()
	return s.MemStore.LoadSince(ctx, id, after)
}

func (s *countingStore) Commit(ctx context.Context, id string, c agentloop.Commit) error {
	s.mu.Lock()
	s.commits++
	n, f := s.commits, s.failCommit
	s.mu.Unlock()
	if f != nil {
		if fail, applied := f(n, c); fail {
			if applied {
				if err := s.MemStore.Commit(ctx, id, c); err != nil {
					return err
				}
			}
			return errors.New("the connection dropped before the reply")
		}
	}
	return s.MemStore.Commit(ctx, id, c)
}

func (s *countingStore) resetReads() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loads, s.sinces = 0, 0
}

func (s *countingStore) reads() (loads, sinces int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads, s.sinces
}

func toolAgent() agentloop.Agent {
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	return a
}

func say(t *testing.T, h memHarness, id, text string) string {
	t.Helper()
	return h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": text}}})
}

// A Run reads the log whole once, then only what follows it before each
// step; its copy of the log ends equal to the stored one, processed flags
// included.
func TestRunReadsTheLogOnce(t *testing.T) {
	st := &countingStore{MemStore: looptest.NewMemStore()}
	h := memHarness{st.MemStore}
	id := h.CreateSession(t, toolAgent())
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: okTools{}, NewID: looptest.NewID}
	say(t, h, id, "first")
	say(t, h, id, "second")
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	say(t, h, id, "!tool bash {}\n!tools read {}; write {}\n!echo")
	st.resetReads()
	copied, err := r.RunCopy(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	// StartTurn with the first CallModel (one step: nothing to discover),
	// RunTools, CallModel, RunTools, CallModel, EndTurn, Wait.
	if loads, sinces := st.reads(); loads != 1 || sinces != 6 {
		t.Errorf("the run read the whole log %d times and its tail %d times, want 1 and 6", loads, sinces)
	}
	stored := st.Events(id)
	if len(copied) != len(stored) {
		t.Fatalf("the run's copy has %d events, the store %d", len(copied), len(stored))
	}
	for i := range stored {
		c, s := copied[i], stored[i]
		if c.ID != s.ID || c.Type != s.Type || c.Seq != s.Seq || c.Processed != s.Processed {
			t.Errorf("event %d: copy %s %s seq %d processed %v, store %s %s seq %d processed %v",
				i, c.ID, c.Type, c.Seq, c.Processed, s.ID, s.Type, s.Seq, s.Processed)
		}
	}
}

// okTools answers every built-in tool call at once.
type okTools struct{}

func (okTools) Run(_ context.Context, _ string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: c.Name + " ok"}}}, nil
}

// recordingModel is the fake model, noting each request's system prompt.
type recordingModel struct {
	mu      sync.Mutex
	systems []string
}

func (m *recordingModel) Generate(ctx context.Context, req model.Request, d model.DeltaFunc) (model.Response, error) {
	m.mu.Lock()
	m.systems = append(m.systems, req.System)
	m.mu.Unlock()
	return model.Fake{}.Generate(ctx, req, d)
}

// An agent snapshot changed during a Run (a session update, logged as
// session.updated) is what the Run's next model call uses.
func TestRunRereadsAnUpdatedAgent(t *testing.T) {
	st := &countingStore{MemStore: looptest.NewMemStore()}
	h := memHarness{st.MemStore}
	a := toolAgent()
	a.System = "before"
	id := h.CreateSession(t, a)
	m := &recordingModel{}
	tools := toolRunnerFunc(func(ctx context.Context, sid string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
		b := a
		b.System = "after"
		if err := st.UpdateAgent(id, b); err != nil {
			return agentloop.ToolResult{}, err
		}
		return okTools{}.Run(ctx, sid, c)
	})
	r := &agentloop.Loop{Store: st, Model: m, Tools: tools, NewID: looptest.NewID}
	say(t, h, id, "!tool bash {}")
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if len(m.systems) != 2 || m.systems[0] != "before" || m.systems[1] != "after" {
		t.Fatalf("the model calls had system prompts %q, want before then after", m.systems)
	}
	if loads, _ := st.reads(); loads != 2 {
		t.Errorf("the log was read whole %d times, want 2 (at the start, after the update)", loads)
	}
}

// A commit whose reply is lost may have been applied: the Run stops, and
// the next one reads the log again rather than trusting its copy, so the
// turn goes on from what was stored, nothing done twice.
func TestRunAfterACommitWithALostReply(t *testing.T) {
	st := &countingStore{MemStore: looptest.NewMemStore()}
	h := memHarness{st.MemStore}
	id := h.CreateSession(t, toolAgent())
	failed := false
	st.failCommit = func(_ int, c agentloop.Commit) (bool, bool) {
		for _, e := range c.Events {
			if e.Type == agentloop.AgentToolResult && !failed {
				failed = true
				return true, true
			}
		}
		return false, false
	}
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: okTools{}, NewID: looptest.NewID}
	say(t, h, id, "!tool bash {}\n!echo")
	if err := r.Run(context.Background(), id); err == nil {
		t.Fatal("the run went on after a failed commit")
	}
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range st.Events(id) {
		types = append(types, e.Type)
	}
	want := "user.message session.status_running span.model_request_start agent.tool_use span.model_request_end agent.tool_result span.model_request_start agent.message span.model_request_end session.status_idle"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("log\n got  %s\n want %s", got, want)
	}
}

// toolRunnerFunc is a Toolbox of one function.
type toolRunnerFunc func(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error)

func (f toolRunnerFunc) Run(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	return f(ctx, sessionID, c)
}

// pinFailingStore fails its first pin, as a database restarting would.
type pinFailingStore struct {
	*looptest.MemStore
	failed bool
}

func (s *pinFailingStore) PinMCPTools(ctx context.Context, id, server string, tools []agentloop.MCPTool) error {
	if !s.failed {
		s.failed = true
		return errdefs.Unavailable("database: connection refused")
	}
	return s.MemStore.PinMCPTools(ctx, id, server, tools)
}

// oneToolMCP is an MCP server that offers one tool.
type oneToolMCP struct{}

func (oneToolMCP) ListTools(context.Context, string, agentloop.MCPServer) ([]agentloop.MCPTool, error) {
	return []agentloop.MCPTool{{Name: "lookup", InputSchema: json.RawMessage(`{"type":"object"}`)}}, nil
}

func (oneToolMCP) CallTool(context.Context, string, agentloop.MCPServer, string, []byte) (agentloop.ToolResult, error) {
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: "found"}}}, nil
}

// Tools an MCP server listed that cannot be pinned (the store failed) are
// the step's error, which the loop retries, not a session.error blaming
// the server.
func TestMCPPinFailureIsTheStepsError(t *testing.T) {
	st := &pinFailingStore{MemStore: looptest.NewMemStore()}
	h := memHarness{st.MemStore}
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.MCPServers = []agentloop.MCPServer{{Type: "url", Name: "docs", URL: "http://docs.invalid/mcp"}}
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.MCPToolset, MCPServerName: "docs"}}
	id := h.CreateSession(t, a)
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, MCP: oneToolMCP{}, NewID: looptest.NewID}
	say(t, h, id, "hello")
	if err := r.Run(context.Background(), id); !errdefs.IsUnavailable(err) {
		t.Fatalf("Run with a failing pin: %v, want the store's error", err)
	}
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	log := st.Events(id)
	if n := count(log, agentloop.SessionError); n != 0 {
		t.Fatalf("%d session errors", n)
	}
	agent, _, err := st.Load(context.Background(), id)
	if err != nil || len(agent.MCPTools["docs"]) != 1 {
		t.Fatalf("pins %+v, %v", agent.MCPTools, err)
	}
	if last := log[len(log)-1]; last.StopReason == nil || last.StopReason.Type != "end_turn" {
		t.Fatalf("the turn ended with %+v", last)
	}
}

// downStore fails the loop's reads with errors of kind until it has failed
// n times, then signals each commit that idles the session.
type downStore struct {
	*looptest.MemStore
	kind func(format string, args ...any) error
	idle chan struct{}

	mu    sync.Mutex
	fails int // guarded by mu: failures left
}

func (s *downStore) Load(ctx context.Context, id string) (agentloop.Agent, []agentloop.Event, error) {
	s.mu.Lock()
	down := s.fails > 0
	s.fails--
	s.mu.Unlock()
	if down {
		return agentloop.Agent{}, nil, s.kind("database: connection refused")
	}
	return s.MemStore.Load(ctx, id)
}

func (s *downStore) Commit(ctx context.Context, id string, c agentloop.Commit) error {
	err := s.MemStore.Commit(ctx, id, c)
	if err == nil && c.Status == "idle" {
		s.idle <- struct{}{}
	}
	return err
}

// A loop keeps trying through transient store errors (a database
// restart), however many runs they fail; it gives up only on lasting ones.
func TestPoolKeepsTryingThroughTransientErrors(t *testing.T) {
	st := &downStore{MemStore: looptest.NewMemStore(), kind: errdefs.Unavailable, idle: make(chan struct{}, 1), fails: 12}
	h := memHarness{st.MemStore}
	id := h.CreateSession(t, agentloop.Agent{})
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID}
	pool := agentloop.NewPool(r, func(c context.Context, _ string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, nil)
	pool.SetBackoff(func(int) time.Duration { return 0 })
	defer pool.Stop()
	say(t, h, id, "hello")
	pool.Wake("tenant_1", id)
	select {
	case <-st.idle:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop gave up during the outage")
	}
}

// A Run that starts from the copy an earlier Run left reads only the tail
// and the queued events, not the whole log; a copy in which another runner
// has since consumed an event it shows queued is read again whole.
func TestRunStartsFromTheCopyAnEarlierRunLeft(t *testing.T) {
	st := &countingStore{MemStore: looptest.NewMemStore()}
	h := memHarness{st.MemStore}
	id := h.CreateSession(t, toolAgent())
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: okTools{}, NewID: looptest.NewID}
	ctx := context.Background()
	var c agentloop.Copy
	say(t, h, id, "first")
	if err := r.RunKeeping(ctx, id, &c); err != nil {
		t.Fatal(err)
	}
	say(t, h, id, "!tool bash {}\n!echo")
	st.resetReads()
	if err := r.RunKeeping(ctx, id, &c); err != nil {
		t.Fatal(err)
	}
	if loads, _ := st.reads(); loads != 0 {
		t.Errorf("the second run read the whole log %d times, want 0", loads)
	}
	if n := strings.Count(eventTypes(st.Events(id)), "agent.tool_result"); n != 1 {
		t.Fatalf("%d tool results after the second run", n)
	}

	// A copy that shows "third" queued; then another runner (a fresh
	// copy) runs its turn. When the first copy's loop runs again, for
	// "fourth", it must not run "third" again.
	say(t, h, id, "third")
	stale, err := r.CopyOf(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var other agentloop.Copy
	if err := r.RunKeeping(ctx, id, &other); err != nil {
		t.Fatal(err)
	}
	say(t, h, id, "fourth")
	st.resetReads()
	if err := r.RunKeeping(ctx, id, &stale); err != nil {
		t.Fatal(err)
	}
	if loads, _ := st.reads(); loads != 1 {
		t.Errorf("the stale copy's run read the whole log %d times, want 1", loads)
	}
	if turns := strings.Count(eventTypes(st.Events(id)), "session.status_running"); turns != 4 {
		t.Fatalf("%d turns for 4 messages (%s)", turns, eventTypes(st.Events(id)))
	}
}

func eventTypes(evs []agentloop.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.Type + " ")
	}
	return b.String()
}
