package sdk

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"
)

type stream = *ssestream.Stream[anthropic.BetaManagedAgentsStreamSessionEventsUnion]

func say(text string) anthropic.BetaManagedAgentsEventParamsUnion {
	return anthropic.BetaManagedAgentsEventParamsUnion{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{
		Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: text}}},
	}}
}

// next reads the stream until an idle status and returns what came, checking
// that the SDK decoded every event cleanly.
func untilIdle(t testing.TB, s stream) []anthropic.BetaManagedAgentsStreamSessionEventsUnion {
	t.Helper()
	var got []anthropic.BetaManagedAgentsStreamSessionEventsUnion
	for s.Next() {
		e := s.Current()
		decodedCleanly(t, "stream "+e.Type, e)
		got = append(got, e)
		if e.Type == "session.status_idle" {
			return got
		}
	}
	t.Fatalf("stream ended before idle (after %d events): %v", len(got), s.Err())
	return nil
}

func typesOf(evs []anthropic.BetaManagedAgentsStreamSessionEventsUnion) string {
	var ts []string
	for _, e := range evs {
		ts = append(ts, e.Type)
	}
	return strings.Join(ts, " ")
}

func TestSessionEventsThroughTheSDK(t *testing.T) {
	client := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "events",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{
			{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{
				DefaultConfig: anthropic.BetaManagedAgentsAgentToolsetDefaultConfigParams{
					PermissionPolicy: anthropic.BetaManagedAgentsAgentToolsetDefaultConfigParamsPermissionPolicyUnion{OfAlwaysAsk: &anthropic.BetaManagedAgentsAlwaysAskPolicyParam{}},
				},
			}},
			{OfCustom: &anthropic.BetaManagedAgentsCustomToolParams{
				Name: "get_weather", Description: "Weather for a city",
				InputSchema: anthropic.BetaManagedAgentsCustomToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "events"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: env.ID,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Open the stream first, then send.
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{
		EventDeltas: []anthropic.BetaManagedAgentsDeltaType{"agent.message"},
	})
	defer s.Close()
	send := func(evs ...anthropic.BetaManagedAgentsEventParamsUnion) {
		t.Helper()
		res, err := client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{Events: evs})
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		decodedCleanly(t, "Events.Send", res)
		if len(res.Data) != len(evs) || !strings.HasPrefix(res.Data[0].ID, "sevt_") {
			t.Fatalf("Send echoed %s", res.RawJSON())
		}
	}

	// A plain message: a turn that ends with end_turn.
	send(say("hello"))
	turn := untilIdle(t, s)
	want := "user.message session.status_running span.model_request_start event_start event_delta agent.message span.model_request_end session.status_idle"
	if got := typesOf(turn); got != want {
		t.Fatalf("turn:\n got  %s\n want %s", got, want)
	}
	msg := turn[5].AsAgentMessage()
	if msg.Content[0].Text != "echo: hello" {
		t.Fatalf("agent said %q", msg.Content[0].Text)
	}
	if turn[3].AsEventStart().Event.ID != msg.ID {
		t.Fatal("the preview does not name the message it previews")
	}
	if idle := turn[7].AsSessionStatusIdle(); idle.StopReason.Type != "end_turn" || idle.JSON.StopDetails.Raw() != "null" {
		t.Fatalf("idle %s", idle.RawJSON())
	}
	end := turn[6].AsSpanModelRequestEnd()
	if end.ModelRequestStartID != turn[2].ID || end.ModelUsage.OutputTokens == 0 {
		t.Fatalf("span end %s", end.RawJSON())
	}
	// The turn ran for a moment: stats.active_seconds counts it, and it
	// stays fixed while the session is idle.
	got, err := client.Beta.Sessions.Get(ctx, sess.ID, anthropic.BetaSessionGetParams{})
	if err != nil {
		t.Fatal(err)
	}
	if st := got.Stats; st.ActiveSeconds <= 0 || st.ActiveSeconds > st.DurationSeconds {
		t.Fatalf("after a turn: stats %s", st.RawJSON())
	}
	again, err := client.Beta.Sessions.Get(ctx, sess.ID, anthropic.BetaSessionGetParams{})
	if err != nil || again.Stats.ActiveSeconds != got.Stats.ActiveSeconds {
		t.Fatalf("an idle session's active seconds went from %v to %v (%v)", got.Stats.ActiveSeconds, again.Stats.ActiveSeconds, err)
	}

	// The model declines: the turn ends idle with the refusal and its
	// details, and no tool it named runs.
	send(say("!refuse cyber That is not something I can help with."))
	turn = untilIdle(t, s)
	refused := turn[len(turn)-1].AsSessionStatusIdle()
	if refused.StopReason.Type != "refusal" || refused.StopDetails.Type != "refusal" || refused.StopDetails.Category != "cyber" ||
		refused.StopDetails.Explanation != "That is not something I can help with." {
		t.Fatalf("refusal: %s (turn %s)", refused.RawJSON(), typesOf(turn))
	}
	decodedCleanly(t, "session.status_idle refusal", refused)
	send(say("!refuse -"))
	turn = untilIdle(t, s)
	if r := turn[len(turn)-1].AsSessionStatusIdle(); r.StopReason.Type != "refusal" || r.StopDetails.JSON.Category.Raw() != "null" || r.StopDetails.JSON.Explanation.Raw() != "null" {
		t.Fatalf("a refusal without details: %s", r.RawJSON())
	}

	// Images and documents in a user message, as the SDK sends them: the
	// log keeps them as sent (the model gets them: server's
	// TestAnthropicModelRunsATurn), and the SDK decodes them cleanly.
	send(anthropic.BetaManagedAgentsEventParamsUnion{OfUserMessage: &anthropic.BetaManagedAgentsUserMessageEventParams{
		Content: []anthropic.BetaManagedAgentsUserMessageEventParamsContentUnion{
			{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: "look"}},
			{OfImage: &anthropic.BetaManagedAgentsImageBlockParam{Source: anthropic.BetaManagedAgentsImageBlockSourceUnionParam{
				OfBase64: &anthropic.BetaManagedAgentsBase64ImageSourceParam{Data: "iVBORw0KGgo=", MediaType: "image/png"}}}},
			{OfDocument: &anthropic.BetaManagedAgentsDocumentBlockParam{Title: anthropic.String("notes"), Source: anthropic.BetaManagedAgentsDocumentBlockSourceUnionParam{
				OfText: &anthropic.BetaManagedAgentsPlainTextDocumentSourceParam{Data: "plain notes"}}}},
		},
	}})
	turn = untilIdle(t, s)
	um := turn[0].AsUserMessage()
	if len(um.Content) != 3 || um.Content[1].Type != "image" || um.Content[1].Source.Data != "iVBORw0KGgo=" ||
		um.Content[2].Type != "document" || um.Content[2].Title != "notes" || um.Content[2].Source.Data != "plain notes" {
		t.Fatalf("the user message with an image and a document: %s", um.RawJSON())
	}

	// A custom tool round trip.
	send(say("!tool get_weather {\"city\":\"Paris\"}\n!echo"))
	turn = untilIdle(t, s)
	idle := turn[len(turn)-1].AsSessionStatusIdle()
	use := turn[len(turn)-3].AsAgentCustomToolUse()
	if idle.StopReason.Type != "requires_action" || len(idle.StopReason.EventIDs) != 1 || idle.StopReason.EventIDs[0] != use.ID || use.Name != "get_weather" {
		t.Fatalf("custom tool turn: %s", typesOf(turn))
	}
	if use.Input["city"] != "Paris" {
		t.Fatalf("custom tool input %v", use.Input)
	}
	got, err = client.Beta.Sessions.Get(ctx, sess.ID, anthropic.BetaSessionGetParams{})
	if err != nil || got.Status != "idle" {
		t.Fatalf("session while waiting: %v %v", got.Status, err)
	}
	send(anthropic.BetaManagedAgentsEventParamsUnion{OfUserCustomToolResult: &anthropic.BetaManagedAgentsUserCustomToolResultEventParams{
		CustomToolUseID: use.ID,
		Content:         []anthropic.BetaManagedAgentsUserCustomToolResultEventParamsContentUnion{{OfText: &anthropic.BetaManagedAgentsTextBlockParam{Text: "sunny"}}},
	}})
	turn = untilIdle(t, s)
	var final string
	for _, e := range turn {
		if e.Type == "agent.message" {
			final = e.AsAgentMessage().Content[0].Text
		}
	}
	if final != "results: sunny" || turn[len(turn)-1].AsSessionStatusIdle().StopReason.Type != "end_turn" {
		t.Fatalf("after the tool result: %q, %s", final, typesOf(turn))
	}

	// always_ask: denial reaches the model; approval needs a sandbox, which
	// this release reports as an error instead of faking a result.
	confirm := func(result, msg string) {
		send(say("!tool bash {\"command\":\"ls\"}\n!echo"))
		turn := untilIdle(t, s)
		tu := turn[len(turn)-3].AsAgentToolUse()
		if tu.EvaluatedPermission != "ask" || turn[len(turn)-1].AsSessionStatusIdle().StopReason.EventIDs[0] != tu.ID {
			t.Fatalf("always_ask turn: %s", typesOf(turn))
		}
		p := &anthropic.BetaManagedAgentsUserToolConfirmationEventParams{ToolUseID: tu.ID, Result: anthropic.BetaManagedAgentsUserToolConfirmationEventParamsResult(result)}
		if msg != "" {
			p.DenyMessage = anthropic.String(msg)
		}
		send(anthropic.BetaManagedAgentsEventParamsUnion{OfUserToolConfirmation: p})
	}
	confirm("deny", "not here")
	turn = untilIdle(t, s)
	if typesOf(turn[:3]) != "user.tool_confirmation session.status_running agent.tool_result" {
		t.Fatalf("after denial: %s", typesOf(turn))
	}
	if r := turn[2].AsAgentToolResult(); !r.IsError || r.Content[0].Text != "not here" {
		t.Fatalf("denied result %s", r.RawJSON())
	}
	confirm("allow", "")
	turn = untilIdle(t, s)
	if typesOf(turn) != "user.tool_confirmation session.status_running session.error session.status_idle" {
		t.Fatalf("after approval: %s", typesOf(turn))
	}
	if e := turn[2].AsSessionError(); !strings.Contains(e.Error.Message, "sandbox") {
		t.Fatalf("session.error %s", e.RawJSON())
	}

	// The whole log, through the auto-pager, page size 3.
	pager := client.Beta.Sessions.Events.ListAutoPaging(ctx, sess.ID, anthropic.BetaSessionEventListParams{Limit: anthropic.Int(3)})
	n, last := 0, ""
	for pager.Next() {
		e := pager.Current()
		decodedCleanly(t, "Events.List", e)
		if e.ID == last {
			t.Fatal("the pager returned an event twice")
		}
		last = e.ID
		n++
	}
	if pager.Err() != nil || n < 30 {
		t.Fatalf("listed %d events: %v", n, pager.Err())
	}
	desc, err := client.Beta.Sessions.Events.List(ctx, sess.ID, anthropic.BetaSessionEventListParams{Limit: anthropic.Int(1), Order: "desc"})
	if err != nil || len(desc.Data) != 1 || desc.Data[0].ID != last {
		t.Fatalf("newest first: %v %v", desc, err)
	}

	// Archived sessions take no events: 409, typed.
	if _, err := client.Beta.Sessions.Archive(ctx, sess.ID, anthropic.BetaSessionArchiveParams{}); err != nil {
		t.Fatal(err)
	}
	_, err = client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{say("hi")}})
	apiError(t, err, http.StatusConflict)
	if _, err := client.Beta.Sessions.Delete(ctx, sess.ID, anthropic.BetaSessionDeleteParams{}); err != nil {
		t.Fatal(err)
	}
	// Deleting the session ends its stream with session.deleted.
	for s.Next() {
		if s.Current().Type == "session.deleted" {
			return
		}
	}
	t.Fatalf("stream ended without session.deleted: %v", s.Err())
}
