package agentloop_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/waitfor"
)

type memHarness struct{ *looptest.MemStore }

func (h memHarness) Store() agentloop.Store { return h.MemStore }

func (h memHarness) CreateSession(t *testing.T, a agentloop.Agent) string {
	id := "sesn_" + looptest.NewID()[5:]
	h.MemStore.CreateSession(id, a)
	return id
}

func (h memHarness) Send(t *testing.T, id string, event map[string]any) string {
	t.Helper()
	event["id"] = looptest.NewID()
	b, _ := json.Marshal(event)
	if err := h.AddUserEvent(id, b); err != nil {
		t.Fatal(err)
	}
	return event["id"].(string)
}

func (h memHarness) Status(t *testing.T, id string) string { return h.MemStore.Status(id) }

func TestLoopOnMemStore(t *testing.T) {
	looptest.RunSuite(t, func(t *testing.T) looptest.Harness { return memHarness{looptest.NewMemStore()} })
}

// Wakes that arrive while a loop is finishing are never lost: every message
// sent gets its turn.
func TestPoolLosesNoWake(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, agentloop.Agent{})
	r := &agentloop.Loop{Store: ms, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID}
	pool := agentloop.NewPool(r, func(c context.Context, _ string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, nil)
	defer pool.Stop()
	const n = 200
	for i := 0; i < n; i++ {
		h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "m"}}})
		pool.Wake(tenant.Default, id)
	}
	waitfor.State(t, 30*time.Second, "every message processed and the session idle (else a wake was lost)", func() (bool, string) {
		queued := 0
		for _, e := range ms.Events(id) {
			if e.Type == agentloop.UserMessage && !e.Processed {
				queued++
			}
		}
		st := ms.Status(id)
		return queued == 0 && st == "idle", fmt.Sprintf("%d messages queued, status %s", queued, st)
	})
}

func TestPoliciesFailClosed(t *testing.T) {
	for policy, wantAsk := range map[string]bool{"always_allow": false, "always_ask": true, "auto": true, "something_new": true} {
		var a agentloop.Agent
		a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset, DefaultConfig: &agentloop.ToolConfig{PermissionPolicy: &agentloop.Policy{Type: policy}}}}
		ms := looptest.NewMemStore()
		h := memHarness{ms}
		id := h.CreateSession(t, a)
		h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "!tool bash {}"}}})
		r := &agentloop.Loop{Store: ms, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID}
		if err := r.Run(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		for _, e := range ms.Events(id) {
			if e.Type == agentloop.AgentToolUse && (e.EvaluatedPermission == "ask") != wantAsk {
				t.Errorf("policy %s: evaluated_permission %q", policy, e.EvaluatedPermission)
			}
		}
	}
}

// A model request whose runner stopped before writing its end (a runner
// replaced mid-call) is made again rather than ending the turn unanswered.
func TestDecideRepeatsAModelRequestCutShort(t *testing.T) {
	log := []agentloop.Event{
		{ID: "u1", Type: "user.message", Processed: true, Content: []model.Block{{Type: "text", Text: "hi"}}},
		{ID: "r1", Type: agentloop.StatusRunning},
		{ID: "s1", Type: agentloop.SpanModelRequestStart},
	}
	act, err := agentloop.Decide(agentloop.Agent{}, log, agentloop.Config{})
	if c, ok := act.(agentloop.CallModel); err != nil || !ok || c.Round != 2 {
		t.Fatalf("after a cut-short request: %#v, %v; want the model called again (round 2)", act, err)
	}
	log = append(log,
		agentloop.Event{ID: "m1", Type: agentloop.AgentMessage, Content: []model.Block{{Type: "text", Text: "hello"}}},
		agentloop.Event{ID: "e1", Type: agentloop.SpanModelRequestEnd})
	if act, err := agentloop.Decide(agentloop.Agent{}, log, agentloop.Config{}); err != nil {
		t.Fatal(err)
	} else if _, ok := act.(agentloop.EndTurn); !ok {
		t.Fatalf("after a finished request: %#v; want the turn to end", act)
	}
}
