package agentloop_test

import (
	"reflect"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
)

// TestDecideSelfHosted: a self-hosted session's built-in tool calls are
// left for its worker (the session blocks until a user.tool_result), a
// denied call is still answered by the loop, and an interrupt abandons
// nothing (the worker sees it).
func TestDecideSelfHosted(t *testing.T) {
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	a.SelfHosted = true
	turn := []agentloop.Event{
		{ID: "m", Type: agentloop.UserMessage, Processed: true, Content: []model.Block{{Type: "text", Text: "hi"}}},
		{ID: "r", Type: agentloop.StatusRunning},
		{ID: "s", Type: agentloop.SpanModelRequestStart},
		{ID: "use", Type: agentloop.AgentToolUse, Name: "bash", EvaluatedPermission: "allow"},
		{ID: "no", Type: agentloop.AgentToolUse, Name: "nope", EvaluatedPermission: "deny"},
		{ID: "e", Type: agentloop.SpanModelRequestEnd},
	}
	with := func(evs ...agentloop.Event) []agentloop.Event {
		return append(append([]agentloop.Event(nil), turn...), evs...)
	}
	deniedResult := agentloop.Event{ID: "nr", Type: agentloop.AgentToolResult, ToolUseID: "no", IsError: true}
	idle := agentloop.Event{ID: "i", Type: agentloop.StatusIdle, StopReason: &agentloop.StopReason{Type: "requires_action", EventIDs: []string{"use"}}}
	result := agentloop.Event{ID: "res", Type: agentloop.UserToolResult, ToolUseID: "use", Content: []model.Block{{Type: "text", Text: "/home/w"}}}
	for _, c := range []struct {
		name string
		log  []agentloop.Event
		want agentloop.Action
	}{
		{"the allowed call waits for the worker", turn, agentloop.Block{EventIDs: []string{"use"}}},
		{"blocked: wait", with(idle), agentloop.Wait{}},
		{"an interrupt abandons nothing", with(idle, agentloop.Event{ID: "x", Type: agentloop.UserInterrupt}),
			agentloop.EndTurn{Stop: agentloop.StopReason{Type: "end_turn"}, Consume: []string{"x"}}},
		{"then the denied call is answered here", with(idle, result), agentloop.RunTools{
			Calls:   []agentloop.ToolCall{{EventID: "no", Name: "nope", Deny: true, DenyMessage: `tool "nope" is not available to this agent`}},
			Consume: []string{"res"}, NeedRunning: true}},
	} {
		got, err := agentloop.Decide(a, c.log, agentloop.Config{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %#v, want %#v", c.name, got, c.want)
		}
	}

	// The worker's result resumes the turn: the model gets it.
	result.Processed = true
	got, err := agentloop.Decide(a, with(idle, result, agentloop.Event{ID: "r2", Type: agentloop.StatusRunning}, deniedResult), agentloop.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cm, ok := got.(agentloop.CallModel)
	if !ok || cm.NeedRunning {
		t.Fatalf("after the result: %#v", got)
	}
	last := cm.Request.Messages[len(cm.Request.Messages)-1]
	if last.Role != "user" || len(last.Content) != 2 || last.Content[0].ToolUseID != "use" || last.Content[0].Content[0].Text != "/home/w" {
		t.Fatalf("the model is sent %#v", last)
	}

	// A cloud session runs the same call itself.
	a.SelfHosted = false
	got, err = agentloop.Decide(a, with(deniedResult), agentloop.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if rt, ok := got.(agentloop.RunTools); !ok || len(rt.Calls) != 1 || rt.Calls[0].EventID != "use" {
		t.Fatalf("cloud: %#v", got)
	}
}
