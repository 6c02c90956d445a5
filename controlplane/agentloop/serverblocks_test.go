package agentloop_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
)

// scripted answers each model call with the next response and records
// the requests.
type scripted struct {
	mu sync.Mutex
	// Fields below guarded by mu.
	replies []model.Response
	reqs    []model.Request
}

func (s *scripted) Generate(_ context.Context, req model.Request, _ model.DeltaFunc) (model.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	if len(s.replies) == 0 {
		return model.Response{Content: []model.Block{{Type: "text", Text: "done"}}, StopReason: "end_turn"}, nil
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return r, nil
}

var (
	thinkingBlock = model.Block{Type: "thinking", Thinking: "I should search.", Signature: "sig-AAA"}
	searchUse     = model.Block{Type: "server_tool_use", ID: "srvtoolu_1", Name: "web_search", Input: json.RawMessage(`{"query":"gvisor"}`),
		Raw: json.RawMessage(`{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"gvisor"}}`)}
	searchResult = model.Block{Type: "web_search_tool_result", ToolUseID: "srvtoolu_1",
		Raw: json.RawMessage(`{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://gvisor.dev/","title":"gVisor","encrypted_content":"enc-CCC"}]}`)}
)

func webAgent() agentloop.Agent {
	var a agentloop.Agent
	a.Model.ID = "m"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	return a
}

// A response with thinking and a server tool's use and result, paused:
// the events show agent.thinking and the search as agent.tool_use and
// agent.tool_result; the turn goes on with the paused response sent back
// block for block, and the next turn's request still carries it.
func TestThinkingAndServerToolsRoundTrip(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, webAgent())
	m := &scripted{replies: []model.Response{
		{Content: []model.Block{thinkingBlock, searchUse, searchResult, {Type: "text", Text: "Searching on."}}, StopReason: "pause_turn"},
		{Content: []model.Block{{Type: "text", Text: "Found it."}}, StopReason: "end_turn"},
	}}
	r := &agentloop.Loop{Store: ms, Model: m, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID,
		Config: agentloop.Config{Thinking: &model.Thinking{Type: "adaptive"}}}
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "search gvisor"}}})
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}

	var kinds []string
	var useID string
	for i, raw := range ms.RawEvents(id) {
		e := ms.Events(id)[i]
		kinds = append(kinds, e.Type)
		switch e.Type {
		case agentloop.AgentThinking:
			if s := string(raw); strings.Contains(s, "sig-AAA") || strings.Contains(s, "I should") {
				t.Errorf("agent.thinking shows the thinking: %s", s)
			}
		case agentloop.AgentToolUse:
			useID = e.ID
			if e.Name != "web_search" || string(e.Input) != `{"query":"gvisor"}` || e.EvaluatedPermission != "allow" {
				t.Errorf("agent.tool_use = %s", raw)
			}
		case agentloop.AgentToolResult:
			if e.ToolUseID != useID || e.IsError || len(e.Content) != 1 || e.Content[0].Text != "gVisor\nhttps://gvisor.dev/" {
				t.Errorf("agent.tool_result = %s", raw)
			}
			if strings.Contains(string(raw), "enc-CCC") {
				t.Errorf("agent.tool_result shows the encrypted content: %s", raw)
			}
		case agentloop.SessionError:
			t.Errorf("session.error: %s", raw)
		}
	}
	want := "user.message session.status_running span.model_request_start agent.thinking agent.tool_use agent.tool_result agent.message span.model_request_end " +
		"span.model_request_start agent.message span.model_request_end session.status_idle"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("events:\n%s\nwant\n%s", got, want)
	}
	if len(m.reqs) != 2 {
		t.Fatalf("%d model calls, want 2 (the pause continued once)", len(m.reqs))
	}
	if m.reqs[0].Thinking == nil || m.reqs[0].Thinking.Type != "adaptive" {
		t.Errorf("thinking config = %+v", m.reqs[0].Thinking)
	}
	wantAssistant := []model.Block{thinkingBlock, searchUse, searchResult, {Type: "text", Text: "Searching on."}}
	checkLast := func(req model.Request, want []model.Block) {
		t.Helper()
		var got []model.Block
		for _, msg := range req.Messages {
			if msg.Role == "assistant" {
				got = msg.Content
			}
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Errorf("assistant message sent back:\n%s\nwant\n%s", gb, wb)
		}
	}
	checkLast(m.reqs[1], wantAssistant)
	if last := m.reqs[1].Messages[len(m.reqs[1].Messages)-1]; last.Role != "assistant" {
		t.Errorf("the continuation's last message is the %s's, want the paused assistant's", last.Role)
	}

	// The next turn: the earlier assistant message, continuation merged,
	// still carries the blocks.
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "thanks"}}})
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	req := m.reqs[2]
	if len(req.Messages) != 3 {
		t.Fatalf("messages = %+v", req.Messages)
	}
	gb, _ := json.Marshal(req.Messages[1].Content)
	wb, _ := json.Marshal(append(wantAssistant, model.Block{Type: "text", Text: "Found it."}))
	if string(gb) != string(wb) {
		t.Errorf("next turn's assistant message:\n%s\nwant\n%s", gb, wb)
	}
}

// A model that pauses every time: the turn continues MaxPauses times, then
// ends with a session.error that says so.
func TestPauseTurnIsBounded(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, webAgent())
	m := &scripted{}
	for range 10 {
		m.replies = append(m.replies, model.Response{Content: []model.Block{searchUse, searchResult}, StopReason: "pause_turn"})
	}
	r := &agentloop.Loop{Store: ms, Model: m, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID, Config: agentloop.Config{MaxPauses: 2}}
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "go"}}})
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if len(m.reqs) != 3 {
		t.Errorf("%d model calls, want 3 (the first and two continuations)", len(m.reqs))
	}
	evs := ms.Events(id)
	var msg string
	for _, e := range evs {
		if e.Type == agentloop.SessionError {
			msg = string(e.Error)
		}
	}
	if !strings.Contains(msg, "paused the turn 3 times, past the limit of 2") {
		t.Errorf("session.error = %s", msg)
	}
	if last := evs[len(evs)-1]; last.Type != agentloop.StatusIdle || last.StopReason.Type != "end_turn" {
		t.Errorf("last event %+v", last)
	}
}

// stopAll ends every turn before its model request.
type stopAll struct{ stop agentloop.Stop }

func (s stopAll) BeforeModelRequest(context.Context, string) (*agentloop.Stop, error) {
	return &s.stop, nil
}

// A turn that its Limits stop makes no model request: it starts, reports
// the error and idles with the stop's reason.
func TestLimitsEndTheTurnBeforeTheModel(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, webAgent())
	m := &scripted{}
	r := &agentloop.Loop{Store: ms, Model: m, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID,
		Limits: stopAll{agentloop.Stop{Reason: agentloop.StopReason{Type: "budget_reached"}, Error: &agentloop.ErrorInfo{Type: "unknown_error", Message: "spent", RetryStatus: "exhausted"}}}}
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "go"}}})
	if err := r.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if len(m.reqs) != 0 {
		t.Errorf("%d model requests, want none", len(m.reqs))
	}
	var kinds []string
	evs := ms.Events(id)
	for _, e := range evs {
		kinds = append(kinds, e.Type)
	}
	if got := strings.Join(kinds, " "); got != "user.message session.status_running session.error session.status_idle" {
		t.Errorf("events: %s", got)
	}
	if last := evs[len(evs)-1]; last.StopReason == nil || last.StopReason.Type != "budget_reached" || !evs[0].Processed {
		t.Errorf("last event %+v, message processed %v", last, evs[0].Processed)
	}
}
