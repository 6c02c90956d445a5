package agentloop_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/waitfor"
)

// blockingModel answers only when its call's context ends, and reports
// which sessions' calls ended that way.
type blockingModel struct {
	started chan string
	mu      sync.Mutex
	ended   map[tenant.ID]bool
}

func (m *blockingModel) Generate(ctx context.Context, _ model.Request, _ model.DeltaFunc) (model.Response, error) {
	id, _ := tenant.From(ctx)
	m.started <- string(id)
	<-ctx.Done()
	m.mu.Lock()
	m.ended[id] = true
	m.mu.Unlock()
	return model.Response{}, ctx.Err()
}

// StopTenant cancels the loops of one tenant's sessions, mid model call,
// and leaves the others running.
func TestStopTenant(t *testing.T) {
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	m := &blockingModel{started: make(chan string, 2), ended: map[tenant.ID]bool{}}
	r := &agentloop.Loop{Store: ms, Model: m, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID}
	pool := agentloop.NewPool(r, func(ctx context.Context, _ string) (context.Context, func(), bool, error) {
		return ctx, func() {}, true, nil
	}, nil)
	defer pool.Stop()
	for _, tid := range []tenant.ID{"tenant_gone", "tenant_stay"} {
		id := h.CreateSession(t, agentloop.Agent{})
		h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "hi"}}})
		pool.Wake(tid, id)
	}
	for range 2 {
		waitfor.Chan(t, 30*time.Second, "both loops to reach the model", m.started)
	}
	pool.StopTenant("tenant_gone")
	waitfor.Cond(t, 30*time.Second, "the stopped tenant's model call to end", func() bool {
		m.mu.Lock()
		gone, stay := m.ended["tenant_gone"], m.ended["tenant_stay"]
		m.mu.Unlock()
		if stay {
			t.Fatal("StopTenant stopped another tenant's loop")
		}
		return gone
	})
}
