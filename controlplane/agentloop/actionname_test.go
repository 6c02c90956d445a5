package agentloop_test

import (
	"testing"

	"corral.dev/corral/controlplane/agentloop"
)

// Every action has a name of its own for the step metric: a new action
// without one would be counted as "invalid".
func TestActionName(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range []agentloop.Action{
		agentloop.Wait{}, agentloop.ConsumeOnly{}, agentloop.StartTurn{}, agentloop.CallModel{},
		agentloop.RunTools{}, agentloop.Block{}, agentloop.EndTurn{},
	} {
		name := agentloop.ActionName(a)
		if name == "invalid" || seen[name] {
			t.Errorf("ActionName(%T) = %q: want a name of its own", a, name)
		}
		seen[name] = true
	}
	if got := agentloop.ActionName(nil); got != "invalid" {
		t.Errorf("ActionName(nil) = %q, want invalid", got)
	}
}
