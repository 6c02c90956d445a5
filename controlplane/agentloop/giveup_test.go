package agentloop_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
)

// pgLikeStore refuses, as PostgreSQL does, to store a commit whose events
// hold a NUL character, and any commit failWhen picks, with a lasting
// (unclassified) error.
type pgLikeStore struct {
	*looptest.MemStore
	failWhen func(c agentloop.Commit) bool
	idle     chan struct{}
}

func (s *pgLikeStore) Commit(ctx context.Context, id string, c agentloop.Commit) error {
	b, err := json.Marshal(c.Events)
	if err != nil {
		return err
	}
	if strings.Contains(string(b), `\u0000`) {
		return errors.New(`ERROR: unsupported Unicode escape sequence (SQLSTATE 22P05): \u0000 cannot be converted to text`)
	}
	if s.failWhen != nil && s.failWhen(c) {
		return errors.New("ERROR: internal detail the tenant must not see (SQLSTATE XX000)")
	}
	if err := s.MemStore.Commit(ctx, id, c); err != nil {
		return err
	}
	if c.Status == "idle" {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
	return nil
}

// poolFor runs a pool over st that retries at once.
func poolFor(t *testing.T, st agentloop.Store, tools agentloop.Toolbox) *agentloop.Pool {
	r := &agentloop.Loop{Store: st, Model: model.Fake{}, Tools: tools, NewID: looptest.NewID}
	pool := agentloop.NewPool(r, func(c context.Context, _ string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, nil)
	pool.SetBackoff(func(int) time.Duration { return 0 })
	t.Cleanup(pool.Stop)
	return pool
}

func waitIdle(t *testing.T, st *pgLikeStore) {
	t.Helper()
	select {
	case <-st.idle:
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not go idle")
	}
}

// TestLoopThatGivesUpLeavesAnIdleSession: a store error that every retry
// meets makes the loop give up; it then leaves a session.error (saying
// nothing of the store's words) and an idle session, never a running one.
func TestLoopThatGivesUpLeavesAnIdleSession(t *testing.T) {
	st := &pgLikeStore{MemStore: looptest.NewMemStore(), idle: make(chan struct{}, 1)}
	st.failWhen = func(c agentloop.Commit) bool {
		for _, e := range c.Events {
			if e.Type == agentloop.AgentMessage {
				return true // the model's answer can never be stored
			}
		}
		return false
	}
	h := memHarness{st.MemStore}
	id := h.CreateSession(t, agentloop.Agent{})
	pool := poolFor(t, st, agentloop.NoSandbox{})
	say(t, h, id, "hello")
	pool.Wake("tenant_1", id)
	waitIdle(t, st)
	if got := st.Status(id); got != "idle" {
		t.Fatalf("status %q after the loop gave up, want idle", got)
	}
	log := st.Events(id)
	var msg string
	for _, e := range log {
		if e.Type == agentloop.SessionError {
			msg = errorOf(t, log).Message
		}
	}
	if msg == "" || strings.Contains(msg, "SQLSTATE") || !strings.Contains(msg, "internal error") {
		t.Fatalf("session.error %q: want one that says internal error and nothing of the store", msg)
	}
	if last := log[len(log)-1]; last.Type != agentloop.StatusIdle || last.StopReason == nil || last.StopReason.Type != "retries_exhausted" {
		t.Fatalf("the log ends with %+v, want session.status_idle (retries_exhausted)", last)
	}
	// A new message starts a new turn.
	st.failWhen = nil
	say(t, h, id, "again")
	pool.Wake("tenant_1", id)
	waitIdle(t, st)
	if n := count(st.Events(id), agentloop.AgentMessage); n != 1 {
		t.Fatalf("%d agent messages after a new message, want 1", n)
	}
}

// TestUnstorableToolInputIsAToolError: a tool input with a NUL (which
// PostgreSQL cannot store) is stored cleaned and answered with an error
// result before anything runs; the turn goes on and ends idle.
func TestUnstorableToolInputIsAToolError(t *testing.T) {
	st := &pgLikeStore{MemStore: looptest.NewMemStore(), idle: make(chan struct{}, 1)}
	h := memHarness{st.MemStore}
	id := h.CreateSession(t, toolAgent())
	ran := 0
	tools := toolFunc(func(context.Context, string, agentloop.ToolCall) (agentloop.ToolResult, error) {
		ran++
		return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: "ran"}}}, nil
	})
	pool := poolFor(t, st, tools)
	say(t, h, id, `!tool read {"file_path":"/workspace/a\u0000/../x"}`)
	pool.Wake("tenant_1", id)
	waitIdle(t, st)
	log := st.Events(id)
	if ran != 0 {
		t.Errorf("the tool ran %d times, want never", ran)
	}
	if n := count(log, agentloop.SessionError); n != 0 {
		t.Fatalf("%d session errors, want none: %+v", n, log)
	}
	var use, res *agentloop.Event
	for i := range log {
		switch log[i].Type {
		case agentloop.AgentToolUse:
			use = &log[i]
		case agentloop.AgentToolResult:
			res = &log[i]
		}
	}
	if use == nil || res == nil || res.ToolUseID != use.ID || !res.IsError || !strings.Contains(res.Content[0].Text, "NUL") {
		t.Fatalf("tool use %+v, result %+v: want an error result naming the NUL", use, res)
	}
	if strings.Contains(string(use.Input), `\u0000`) {
		t.Errorf("the stored input %s still holds the NUL", use.Input)
	}
	if st.Status(id) != "idle" {
		t.Errorf("status %q, want idle", st.Status(id))
	}
}

func TestCheckStorable(t *testing.T) {
	for raw, ok := range map[string]bool{
		`{"a":"b"}`:                  true,
		`{"a":"\u00e9\ud83d\ude00"}`: true,
		`{"a":"\\u0000"}`:            true, // an escaped backslash, then text
		`{"a":"x\u0000y"}`:           false,
		`{"a\u0000":1}`:              false,
		`{"a":"\ud83d"}`:             false,
		`{"a":"\ude00x"}`:            false,
		"{\"a\":\"\xff\"}":           false,
		"{\"a\":\"\x00\"}":           false,
	} {
		if err := agentloop.CheckStorable([]byte(raw)); (err == nil) != ok {
			t.Errorf("CheckStorable(%q) = %v, want ok=%v", raw, err, ok)
		}
	}
}

type toolFunc func(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error)

func (f toolFunc) Run(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	return f(ctx, sessionID, c)
}
