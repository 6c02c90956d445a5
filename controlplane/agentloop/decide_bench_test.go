package agentloop_test

import (
	"fmt"
	"testing"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
)

// BenchmarkDecideLongSession is Decide before a model call, in a session
// of about 10 and about 1,000 events.
func BenchmarkDecideLongSession(b *testing.B) {
	agent := toolAgent()
	for _, turns := range []int{1, 100} {
		var log []agentloop.Event
		text := func(s string) []model.Block { return []model.Block{{Type: "text", Text: s}} }
		for t := range turns {
			use := fmt.Sprintf("use_%d", t)
			log = append(log,
				agentloop.Event{ID: fmt.Sprintf("u_%d", t), Type: agentloop.UserMessage, Processed: true, Content: text("please fix the build")},
				agentloop.Event{Type: agentloop.StatusRunning},
				agentloop.Event{Type: agentloop.SpanModelRequestStart},
				agentloop.Event{ID: use, Type: agentloop.AgentToolUse, Name: "bash", Input: []byte(`{"command":"go test ./..."}`), EvaluatedPermission: "allow"},
				agentloop.Event{Type: agentloop.SpanModelRequestEnd},
				agentloop.Event{Type: agentloop.AgentToolResult, ToolUseID: use, Content: text("ok")},
				agentloop.Event{Type: agentloop.SpanModelRequestStart},
				agentloop.Event{Type: agentloop.AgentMessage, Content: text("fixed")},
				agentloop.Event{Type: agentloop.SpanModelRequestEnd},
				agentloop.Event{Type: agentloop.StatusIdle, StopReason: &agentloop.StopReason{Type: "end_turn"}})
		}
		log = append(log,
			agentloop.Event{ID: "u", Type: agentloop.UserMessage, Processed: true, Content: text("!tool bash {}")},
			agentloop.Event{Type: agentloop.StatusRunning})
		b.Run(fmt.Sprintf("events=%d", len(log)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := agentloop.Decide(agent, log, agentloop.Config{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
