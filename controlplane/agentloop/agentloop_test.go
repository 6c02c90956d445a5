package agentloop_test

import (
	"encoding/json"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
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
