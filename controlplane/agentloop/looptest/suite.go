package looptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/internal/errdefs"
)

// Harness is a Store with the test-only ways in: make a session, send a
// client event, read the status and the log.
type Harness interface {
	Store() agentloop.Store
	// CreateSession makes an idle session for agent and returns its id.
	CreateSession(t *testing.T, agent agentloop.Agent) string
	// Send queues a client event (a JSON object with type and fields; the
	// harness assigns the id) and returns its id.
	Send(t *testing.T, sessionID string, event map[string]any) string
	Status(t *testing.T, sessionID string) string
}

// NewID returns a fresh event id.
func NewID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "sevt_" + hex.EncodeToString(b)
}

// echoTools runs built-in tools by echoing their input, for scenarios where
// tools must succeed.
type echoTools struct{}

func (echoTools) Run(_ context.Context, _ string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: c.Name + " ran " + string(c.Input)}}}, nil
}

// hookTools runs built-in tools like echoTools, calling hook during the
// first call.
func hookTools(hook func()) agentloop.Toolbox {
	var once sync.Once
	return toolFunc(func(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
		once.Do(hook)
		return echoTools{}.Run(ctx, sessionID, c)
	})
}

// toolFunc is a Toolbox of one function.
type toolFunc func(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error)

func (f toolFunc) Run(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	return f(ctx, sessionID, c)
}

type scenario struct {
	h      Harness
	runner *agentloop.Loop
	id     string
}

func (s *scenario) say(t *testing.T, text string) string {
	t.Helper()
	return s.h.Send(t, s.id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": text}}})
}

func (s *scenario) run(t *testing.T) []agentloop.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.runner.Run(ctx, s.id); err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, log, err := s.h.Store().Load(ctx, s.id)
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// types lists event types after the first n events.
func types(log []agentloop.Event, from int) []string {
	var out []string
	for _, e := range log[from:] {
		out = append(out, e.Type)
	}
	return out
}

func expectTypes(t *testing.T, log []agentloop.Event, from int, want ...string) {
	t.Helper()
	got := types(log, from)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events after #%d:\n got  %v\n want %v", from, got, want)
	}
}

func last(log []agentloop.Event, typ string) agentloop.Event {
	for i := len(log) - 1; i >= 0; i-- {
		if log[i].Type == typ {
			return log[i]
		}
	}
	return agentloop.Event{}
}

func customAgent() agentloop.Agent {
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.CustomTool, Name: "get_weather", InputSchema: json.RawMessage(`{"type":"object"}`)}}
	return a
}

func askAgent() agentloop.Agent {
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset, DefaultConfig: &agentloop.ToolConfig{PermissionPolicy: &agentloop.Policy{Type: "always_ask"}}}}
	return a
}

// RunSuite runs the agent loop's scenarios against a store. Every Store
// implementation (the in-memory one and PostgreSQL's) must pass it.
func RunSuite(t *testing.T, newHarness func(t *testing.T) Harness) {
	runMCPSuite(t, newHarness)
	setup := func(t *testing.T, agent agentloop.Agent, tools agentloop.Toolbox) *scenario {
		h := newHarness(t)
		if tools == nil {
			tools = agentloop.NoSandbox{}
		}
		return &scenario{
			h:  h,
			id: h.CreateSession(t, agent),
			runner: &agentloop.Loop{
				Store: h.Store(), Model: model.Fake{}, Tools: tools, NewID: NewID,
				Backoff: func(int) time.Duration { return 0 },
			},
		}
	}

	t.Run("UnknownSession", func(t *testing.T) {
		h := newHarness(t)
		if _, _, err := h.Store().Load(context.Background(), "sesn_nope"); !errdefs.IsNotFound(err) {
			t.Fatalf("Load of unknown session: %v, want not found", err)
		}
		if _, err := h.Store().LoadSince(context.Background(), "sesn_nope", 3); !errdefs.IsNotFound(err) {
			t.Fatalf("LoadSince of unknown session: %v, want not found", err)
		}
	})

	// The reads the loop makes: the whole log, what follows a sequence
	// number, the queued user events.
	t.Run("LoadSinceAndQueued", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store()
		ctx := context.Background()
		id := h.CreateSession(t, customAgent())
		if _, log, err := st.Load(ctx, id); err != nil || len(log) != 0 {
			t.Fatalf("new session: %v, %v", log, err)
		}
		if tail, err := st.LoadSince(ctx, id, 0); err != nil || len(tail) != 0 {
			t.Fatalf("new session, since 0: %v, %v", tail, err)
		}
		m1 := h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "one"}}})
		m2 := h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "two"}}})
		_, log, err := st.Load(ctx, id)
		if err != nil || len(log) != 2 || log[0].ID != m1 || log[0].Seq != 1 || log[1].ID != m2 || log[1].Seq != 2 || log[0].Processed {
			t.Fatalf("log %+v, %v: want %s and %s, seq 1 and 2, queued", log, err, m1, m2)
		}
		tail, err := st.LoadSince(ctx, id, 1)
		if err != nil || len(tail) != 1 || tail[0].ID != m2 || tail[0].Seq != 2 || tail[0].Processed || tail[0].Content[0].Text != "two" {
			t.Fatalf("since 1: %+v, %v; want %s", tail, err, m2)
		}
		if tail, err := st.LoadSince(ctx, id, 2); err != nil || len(tail) != 0 {
			t.Fatalf("since the last: %+v, %v; want nothing", tail, err)
		}
		if q, err := st.Queued(ctx, id); err != nil || len(q) != 2 || q[0].ID != m1 || q[1].ID != m2 {
			t.Fatalf("queued %+v, %v; want both messages", q, err)
		}
		running := agentloop.Out{ID: NewID(), Type: agentloop.StatusRunning, Fields: map[string]any{}}
		if err := st.Commit(ctx, id, agentloop.Commit{Consume: []string{m1}, Events: []agentloop.Out{running}, Status: "running"}); err != nil {
			t.Fatal(err)
		}
		tail, err = st.LoadSince(ctx, id, 2)
		if err != nil || len(tail) != 1 || tail[0].ID != running.ID || tail[0].Seq != 3 || !tail[0].Processed {
			t.Fatalf("since 2 after a commit: %+v, %v; want the status event, seq 3", tail, err)
		}
		if q, err := st.Queued(ctx, id); err != nil || len(q) != 1 || q[0].ID != m2 || q[0].Seq != 2 {
			t.Fatalf("queued after consuming %s: %+v, %v; want %s alone", m1, q, err, m2)
		}
		if _, log, err := st.Load(ctx, id); err != nil || len(log) != 3 || !log[0].Processed || log[1].Processed {
			t.Fatalf("log after the commit %+v, %v", log, err)
		}
	})

	// A client event that arrives while a Run is under way is seen by
	// that Run: the loop reads what was appended before every step.
	t.Run("InputDuringARun", func(t *testing.T) {
		var a agentloop.Agent
		a.Model.ID = "fake"
		a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
		h := newHarness(t)
		id := h.CreateSession(t, a)
		tools := hookTools(func() {
			h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "meanwhile"}}})
		})
		s := &scenario{h: h, id: id, runner: &agentloop.Loop{Store: h.Store(), Model: model.Fake{}, Tools: tools, NewID: NewID}}
		s.say(t, "!tool bash {}")
		log := s.run(t)
		if got := last(log, "agent.message"); len(got.Content) == 0 || got.Content[0].Text != "echo: meanwhile" {
			t.Fatalf("the message sent during the run got no turn in it: %v", types(log, 0))
		}
		for _, e := range log {
			if e.Type == "user.message" && !e.Processed {
				t.Fatalf("message %s left queued", e.ID)
			}
		}
	})

	t.Run("MessageEndTurn", func(t *testing.T) {
		s := setup(t, customAgent(), nil)
		if got := s.h.Status(t, s.id); got != "idle" {
			t.Fatalf("new session status %q", got)
		}
		s.say(t, "hello")
		log := s.run(t)
		expectTypes(t, log, 0, "user.message", "session.status_running", "span.model_request_start", "agent.message", "span.model_request_end", "session.status_idle")
		if !log[0].Processed {
			t.Error("the user message was not marked processed")
		}
		if txt := log[3].Content[0].Text; txt != "echo: hello" {
			t.Errorf("agent said %q", txt)
		}
		if sr := log[5].StopReason; sr == nil || sr.Type != "end_turn" {
			t.Errorf("stop reason %+v", sr)
		}
		if got := s.h.Status(t, s.id); got != "idle" {
			t.Errorf("status %q after the turn", got)
		}
	})

	t.Run("CustomToolRoundTrip", func(t *testing.T) {
		s := setup(t, customAgent(), nil)
		s.say(t, "!tool get_weather {\"city\":\"Paris\"}\n!echo")
		log := s.run(t)
		expectTypes(t, log, 0, "user.message", "session.status_running", "span.model_request_start", "agent.custom_tool_use", "span.model_request_end", "session.status_idle")
		use := log[3]
		var input map[string]string
		if use.Name != "get_weather" || json.Unmarshal(use.Input, &input) != nil || input["city"] != "Paris" {
			t.Fatalf("custom tool use %+v", use)
		}
		if sr := log[5].StopReason; sr == nil || sr.Type != "requires_action" || len(sr.EventIDs) != 1 || sr.EventIDs[0] != use.ID {
			t.Fatalf("stop reason %+v, want requires_action [%s]", sr, use.ID)
		}
		// Running again without an answer changes nothing.
		if again := s.run(t); len(again) != len(log) {
			t.Fatalf("the loop moved without an answer: %v", types(again, len(log)))
		}
		n := len(log)
		s.h.Send(t, s.id, map[string]any{"type": "user.custom_tool_result", "custom_tool_use_id": use.ID, "content": []map[string]string{{"type": "text", "text": "sunny"}}})
		log = s.run(t)
		expectTypes(t, log, n, "user.custom_tool_result", "session.status_running", "span.model_request_start", "agent.message", "span.model_request_end", "session.status_idle")
		if txt := log[n+3].Content[0].Text; txt != "results: sunny" {
			t.Errorf("the model saw %q, want the tool result", txt)
		}
		if sr := log[len(log)-1].StopReason; sr.Type != "end_turn" {
			t.Errorf("final stop reason %+v", sr)
		}
	})

	t.Run("AlwaysAskDeny", func(t *testing.T) {
		s := setup(t, askAgent(), nil)
		s.say(t, "!tool bash {\"command\":\"rm -rf /\"}\n!echo")
		log := s.run(t)
		use := last(log, "agent.tool_use")
		if use.EvaluatedPermission != "ask" {
			t.Fatalf("evaluated_permission %q, want ask", use.EvaluatedPermission)
		}
		if sr := last(log, "session.status_idle").StopReason; sr.Type != "requires_action" || sr.EventIDs[0] != use.ID {
			t.Fatalf("stop reason %+v", sr)
		}
		n := len(log)
		s.h.Send(t, s.id, map[string]any{"type": "user.tool_confirmation", "tool_use_id": use.ID, "result": "deny", "deny_message": "not on my machine"})
		log = s.run(t)
		expectTypes(t, log, n, "user.tool_confirmation", "session.status_running", "agent.tool_result", "span.model_request_start", "agent.message", "span.model_request_end", "session.status_idle")
		res := log[n+2]
		if !res.IsError || res.ToolUseID != use.ID || res.Content[0].Text != "not on my machine" {
			t.Fatalf("denied result %+v", res)
		}
		if txt := log[n+4].Content[0].Text; txt != "results: not on my machine | (error)" {
			t.Errorf("the model saw %q", txt)
		}
	})

	t.Run("AlwaysAskAllowWithoutSandbox", func(t *testing.T) {
		s := setup(t, askAgent(), nil)
		s.say(t, "!tool bash {\"command\":\"ls\"}")
		log := s.run(t)
		use := last(log, "agent.tool_use")
		n := len(log)
		s.h.Send(t, s.id, map[string]any{"type": "user.tool_confirmation", "tool_use_id": use.ID, "result": "allow"})
		log = s.run(t)
		// No sandbox in this release: a clear error ends the turn, and no
		// tool result is made up.
		expectTypes(t, log, n, "user.tool_confirmation", "session.status_running", "session.error", "session.status_idle")
		if strings.Contains(strings.Join(types(log, 0), " "), "agent.tool_result") {
			t.Fatal("a tool result was invented")
		}
		// The next turn still gets a well-formed conversation.
		s.say(t, "hello again")
		log = s.run(t)
		if txt := last(log, "agent.message").Content[0].Text; txt != "echo: hello again" {
			t.Fatalf("next turn said %q", txt)
		}
	})

	t.Run("AllowedToolsRun", func(t *testing.T) {
		var a agentloop.Agent
		a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset, Configs: []agentloop.ToolConfig{{Name: "web_search", Enabled: new(false)}}}}
		s := setup(t, a, echoTools{})
		s.say(t, "!tools bash {\"command\":\"ls\"}; web_search {}\n!echo")
		log := s.run(t)
		var results []agentloop.Event
		for _, e := range log {
			if e.Type == "agent.tool_result" {
				results = append(results, e)
			}
		}
		if len(results) != 2 || results[0].IsError || !results[1].IsError {
			t.Fatalf("results %+v: want bash run and the disabled web_search refused", results)
		}
		if got := last(log, "agent.message").Content[0].Text; !strings.HasPrefix(got, "results: bash ran") {
			t.Fatalf("final message %q", got)
		}
	})

	t.Run("RoundCap", func(t *testing.T) {
		var a agentloop.Agent
		a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
		s := setup(t, a, echoTools{})
		s.runner.Config.MaxRounds = 3
		s.say(t, strings.Repeat("!tool bash {}\n", 10))
		log := s.run(t)
		starts := 0
		for _, e := range log {
			if e.Type == "span.model_request_start" {
				starts++
			}
		}
		if starts != 3 {
			t.Fatalf("%d model requests, want the cap of 3", starts)
		}
		expectTypes(t, log, len(log)-2, "session.error", "session.status_idle")
	})

	t.Run("ModelErrorRetriesThenIdles", func(t *testing.T) {
		s := setup(t, customAgent(), nil)
		s.say(t, "!error model_overloaded_error busy")
		log := s.run(t)
		expectTypes(t, log, 0, "user.message", "session.status_running", "span.model_request_start",
			"session.error", "session.error", "span.model_request_end", "session.error", "session.status_idle")
		if sr := last(log, "session.status_idle").StopReason; sr.Type != "retries_exhausted" {
			t.Fatalf("stop reason %+v", sr)
		}
	})

	t.Run("InterruptEndsTurn", func(t *testing.T) {
		s := setup(t, customAgent(), nil)
		s.say(t, "!tool get_weather {}")
		log := s.run(t)
		n := len(log)
		s.h.Send(t, s.id, map[string]any{"type": "user.interrupt"})
		log = s.run(t)
		expectTypes(t, log, n, "user.interrupt", "session.status_idle")
		if sr := log[len(log)-1].StopReason; sr.Type != "end_turn" {
			t.Fatalf("stop reason %+v", sr)
		}
		// The abandoned tool call does not break the next turn.
		s.say(t, "after")
		log = s.run(t)
		if txt := last(log, "agent.message").Content[0].Text; txt != "echo: after" {
			t.Fatalf("next turn said %q", txt)
		}
		conv := agentloop.Conversation(log)
		for i, m := range conv {
			for _, b := range m.Content {
				if b.Type == "tool_use" && (i+1 >= len(conv) || conv[i+1].Content[0].Type != "tool_result") {
					t.Fatalf("tool_use %s has no result right after it: %+v", b.ID, conv)
				}
			}
		}
	})

	t.Run("QueuedMessagesTakeTurnsInOrder", func(t *testing.T) {
		s := setup(t, customAgent(), nil)
		s.say(t, "first")
		s.say(t, "second")
		log := s.run(t)
		var said []string
		for _, e := range log {
			if e.Type == "agent.message" {
				said = append(said, e.Content[0].Text)
			}
		}
		// Messages queued while idle start one turn together, in order.
		if fmt.Sprint(said) != "[echo: first\nsecond]" {
			t.Fatalf("agent said %q", said)
		}
		for _, e := range log {
			if e.Type == "user.message" && !e.Processed {
				t.Fatal("a queued message was left unprocessed")
			}
		}
	})
}
