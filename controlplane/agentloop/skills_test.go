package agentloop_test

import (
	"strings"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
)

// A session's skills are offered to the model in the system prompt: each
// one's name, description and SKILL.md path, after the agent's own prompt.
func TestSkillsAreInTheSystemPrompt(t *testing.T) {
	log := []agentloop.Event{
		{ID: "u1", Type: "user.message", Processed: true, Content: []model.Block{{Type: "text", Text: "hi"}}},
		{ID: "r1", Type: agentloop.StatusRunning},
	}
	agent := agentloop.Agent{System: "Be brief."}
	act, err := agentloop.Decide(agent, log, agentloop.Config{})
	if c, ok := act.(agentloop.CallModel); err != nil || !ok || c.Request.System != "Be brief." {
		t.Fatalf("without skills: %#v, %v", act, err)
	}
	agent.Skills = []agentloop.Skill{{Name: "csv-tools", Description: "Reads CSV files."}, {Name: "pdf", Description: "Makes PDFs."}}
	act, err = agentloop.Decide(agent, log, agentloop.Config{})
	c, ok := act.(agentloop.CallModel)
	if err != nil || !ok {
		t.Fatalf("with skills: %#v, %v", act, err)
	}
	sys := c.Request.System
	for _, want := range []string{"Be brief.\n\n", "<name>csv-tools</name>", "<description>Reads CSV files.</description>",
		"<location>/mnt/session/uploads/.skills/csv-tools/SKILL.md</location>", "<name>pdf</name>", "/mnt/session/uploads/.skills/pdf/SKILL.md"} {
		if !strings.Contains(sys, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, sys)
		}
	}
	if !strings.HasPrefix(sys, "Be brief.") {
		t.Errorf("the agent's prompt is not first:\n%s", sys)
	}
}
