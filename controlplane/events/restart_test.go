package events_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// idleSignal is the loop's store, signalling every commit that idles the
// session.
type idleSignal struct {
	agentloop.Store
	idle chan struct{}
}

func (s idleSignal) Commit(ctx context.Context, id string, c agentloop.Commit) error {
	err := s.Store.Commit(ctx, id, c)
	if err == nil && c.Status == "idle" {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
	return err
}

// storeTools reads the store for every call, as a tool that needs the
// database would (the built-in tools do not: their path reaches only
// Raft's memory and the host). The first call of each of the first two
// tool uses reads, hands the test a channel (held) and, once the test has
// restarted the database and closed the channel, reads again.
type storeTools struct {
	st   *store.Store
	held chan chan struct{}

	mu sync.Mutex
	// Fields below guarded by mu.
	seen        map[string]bool
	calls       int
	storeErrors []error
}

func (l *storeTools) Run(ctx context.Context, sessionID string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	l.mu.Lock()
	l.calls++
	hold := !l.seen[c.EventID] && len(l.seen) < 2
	l.seen[c.EventID] = true
	l.mu.Unlock()
	if hold {
		if _, err := l.st.Events().Queued(ctx, sessionID); err != nil {
			return agentloop.ToolResult{}, err
		}
		restarted := make(chan struct{})
		l.held <- restarted
		<-restarted
	}
	if _, err := l.st.Events().Queued(ctx, sessionID); err != nil {
		l.mu.Lock()
		l.storeErrors = append(l.storeErrors, err)
		l.mu.Unlock()
		return agentloop.ToolResult{}, err
	}
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: c.Name + " ok"}}}, nil
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// A PostgreSQL restart in the middle of a turn (pg_ctl restart -m fast)
// costs the turn a moment, not a session.error: the tool path retries its
// transient store errors, and the loop retries a step whose commit failed,
// from the log. The turn restarts the database twice: while a tool call
// runs and the loop's own connections are then found working, so the
// tool's read fails alone; and again leaving the loop's connections dead,
// so that its commit fails too.
func TestLoopSurvivesADatabaseRestart(t *testing.T) {
	h := newHarness(t)
	var a agentloop.Agent
	a.Model.ID = "fake"
	a.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	id := h.createSession(t, a)
	idle := make(chan struct{}, 1)
	tools := &storeTools{st: h.st, held: make(chan chan struct{}), seen: map[string]bool{}}
	runner := &agentloop.Loop{
		Store: idleSignal{Store: events.LoopStore{St: h.st}, idle: idle},
		Model: model.Fake{}, Tools: tools, NewID: store.NewEventID,
	}
	pool := agentloop.NewPool(runner, func(c context.Context, _ string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, slog.New(slog.NewTextHandler(testLog{t}, nil)))
	defer pool.Stop()
	ctx, cancel := context.WithTimeout(tenant.With(context.Background(), tenant.Default), time.Minute)
	defer cancel()
	// restartDuring restarts the database while a tool call waits. With
	// warm, it then uses the loop's pool until a query works (a connection
	// that fails is dropped; the next one is new), so what fails next is
	// the tool's read alone: were it not retried, the session.error would
	// be committed.
	restartDuring := func(call string, warm bool) {
		t.Helper()
		var restarted chan struct{}
		select {
		case restarted = <-tools.held:
		case <-time.After(30 * time.Second):
			t.Fatalf("the %s tool call did not start", call)
		}
		if err := pgtest.Cluster(t).Restart(ctx, nil); err != nil {
			t.Fatal(err)
		}
		for i := 0; warm && i < 10; i++ {
			if _, err := h.st.Events().Queued(ctx, id); err == nil {
				break
			}
		}
		close(restarted)
	}

	const rounds = 3
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": strings.Repeat("!tool bash {}\n", rounds)}}})
	pool.Wake(tenant.Default, id)
	restartDuring("first", true)
	restartDuring("second", false)
	back := time.Now()
	select {
	case <-idle:
	case <-time.After(time.Minute):
		t.Fatal("the turn did not end within a minute of the restart")
	}
	took := time.Since(back)
	tools.mu.Lock()
	t.Logf("the turn ended %v after the database was back; tool calls %d, store errors %v", took, tools.calls, tools.storeErrors)
	for _, err := range tools.storeErrors {
		if !errdefs.IsUnavailable(err) {
			t.Errorf("store error %v is not of kind unavailable", err)
		}
	}
	tools.mu.Unlock()

	_, log, err := events.LoopStore{St: h.st}.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	results := 0
	for _, e := range log {
		switch e.Type {
		case agentloop.SessionError:
			t.Errorf("session.error after the restart: %s", e.Error)
		case agentloop.AgentToolResult:
			results++
		}
	}
	if results != rounds {
		t.Errorf("%d tool results, want %d", results, rounds)
	}
	if last := log[len(log)-1]; last.StopReason == nil || last.StopReason.Type != "end_turn" {
		t.Errorf("the turn ended with %+v", last)
	}
	if took > 10*time.Second {
		t.Errorf("the loop took %v to finish the turn after the restart, want a few seconds", took)
	}
}
