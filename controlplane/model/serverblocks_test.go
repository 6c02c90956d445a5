package model

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// serverTurn streams thinking with its signature, a web search the
// provider ran (use and encrypted result), text, and a pause.
var serverTurn = []string{
	"message_start", `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":1}}}`,
	"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"I should "}}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"search."}}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig-AAA"}}`,
	"content_block_stop", `{"type":"content_block_stop","index":0}`,
	"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"opaque-BBB"}}`,
	"content_block_stop", `{"type":"content_block_stop","index":1}`,
	"content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}`,
	"content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"query\":\"gvisor\"}"}}`,
	"content_block_stop", `{"type":"content_block_stop","index":2}`,
	"content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://gvisor.dev/","title":"gVisor","encrypted_content":"enc-CCC","page_age":null}]}}`,
	"content_block_stop", `{"type":"content_block_stop","index":3}`,
	"content_block_start", `{"type":"content_block_start","index":4,"content_block":{"type":"text","text":""}}`,
	"content_block_delta", `{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"Found it."}}`,
	"content_block_stop", `{"type":"content_block_stop","index":4}`,
	"message_delta", `{"type":"message_delta","delta":{"stop_reason":"pause_turn","stop_sequence":null},"usage":{"output_tokens":30}}`,
	"message_stop", `{"type":"message_stop"}`,
}

// TestAnthropicKeepsThinkingAndServerTools: thinking (with its signature),
// redacted thinking and a server tool's use and result come back in
// Response.Content in order, the pause as the stop reason, and sent back
// they reach the provider exactly as it returned them.
func TestAnthropicKeepsThinkingAndServerTools(t *testing.T) {
	srv := newMessagesServer(t, sse(serverTurn...))
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{})
	req := Request{Model: "claude-test", Messages: []Message{{Role: "user", Content: []Block{{Type: "text", Text: "search"}}}},
		Tools: []Tool{{Name: "web_search", Server: ServerWebSearch}}, Thinking: &Thinking{Type: "adaptive"}}
	var deltas []delta
	resp, err := a.Generate(context.Background(), req, func(i int, s string) { deltas = append(deltas, delta{i, s}) })
	if err != nil {
		t.Fatal(err)
	}
	if resp.StopReason != "pause_turn" {
		t.Errorf("stop reason = %q, want pause_turn", resp.StopReason)
	}
	var types []string
	for _, b := range resp.Content {
		types = append(types, b.Type)
	}
	if want := "thinking redacted_thinking server_tool_use web_search_tool_result text"; joinTypes(types) != want {
		t.Fatalf("content types = %v, want %s", types, want)
	}
	if b := resp.Content[0]; b.Thinking != "I should search." || b.Signature != "sig-AAA" {
		t.Errorf("thinking = %+v", b)
	}
	if b := resp.Content[1]; b.Data != "opaque-BBB" {
		t.Errorf("redacted thinking = %+v", b)
	}
	if b := resp.Content[2]; b.ID != "srvtoolu_1" || b.Name != "web_search" || string(b.Input) != `{"query":"gvisor"}` || !b.Server() {
		t.Errorf("server_tool_use = %+v", b)
	}
	if b := resp.Content[3]; b.ToolUseID != "srvtoolu_1" || !bytes.Contains(b.Raw, []byte("enc-CCC")) || !b.Server() {
		t.Errorf("web_search_tool_result = %+v (raw %s)", b, b.Raw)
	}
	if want := []delta{{0, ""}, {1, ""}, {4, "Found it."}}; !reflect.DeepEqual(deltas, want) {
		t.Errorf("deltas = %v, want %v (the thinking blocks' starts, then the text)", deltas, want)
	}
	first := srv.only(t)
	if th, _ := json.Marshal(first.Body["thinking"]); string(th) != `{"type":"adaptive"}` {
		t.Errorf("thinking config = %s", th)
	}

	// The pause is continued: the response goes back as the assistant's
	// turn, block for block.
	srv2 := newMessagesServer(t, sse(toolTurn...))
	a2 := newTestAnthropic(t, srv2.URL, AnthropicConfig{})
	req.Messages = append(req.Messages, Message{Role: "assistant", Content: resp.Content})
	if _, err := a2.Generate(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	msgs := srv2.only(t).Body["messages"].([]any)
	got, _ := json.Marshal(msgs[1])
	want := `{"content":[` +
		`{"signature":"sig-AAA","thinking":"I should search.","type":"thinking"},` +
		`{"data":"opaque-BBB","type":"redacted_thinking"},` +
		`{"id":"srvtoolu_1","input":{"query":"gvisor"},"name":"web_search","type":"server_tool_use"},` +
		`{"content":[{"encrypted_content":"enc-CCC","page_age":null,"title":"gVisor","type":"web_search_result","url":"https://gvisor.dev/"}],"tool_use_id":"srvtoolu_1","type":"web_search_tool_result"},` +
		`{"text":"Found it.","type":"text"}],"role":"assistant"}`
	if string(got) != want {
		t.Errorf("assistant message sent back =\n%s\nwant\n%s", got, want)
	}
}

func joinTypes(ts []string) string {
	var b bytes.Buffer
	for i, t := range ts {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(t)
	}
	return b.String()
}

func TestThinkingValidate(t *testing.T) {
	for _, tc := range []struct {
		th *Thinking
		ok bool
	}{
		{nil, true},
		{&Thinking{Type: "adaptive"}, true},
		{&Thinking{Type: "enabled", BudgetTokens: 2048}, true},
		{&Thinking{Type: "enabled", BudgetTokens: 100}, false},
		{&Thinking{Type: "adaptive", BudgetTokens: 2048}, false},
		{&Thinking{Type: "sometimes"}, false},
	} {
		if err := tc.th.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v, want ok %v", tc.th, err, tc.ok)
		}
	}
}

func TestCheckBaseURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		loopback bool
		ok       bool
	}{
		{"https://models.example.com", false, true},
		{"https://models.example.com/v1/proxy", false, true},
		{"http://models.example.com", true, false},
		{"http://127.0.0.1:8080", false, false},
		{"http://127.0.0.1:8080", true, true},
		{"http://localhost:8080", true, true},
		{"http://[::1]:8080", true, true},
		{"https://user:pw@models.example.com", false, false},
		{"https://models.example.com?x=1", false, false},
		{"ftp://models.example.com", true, false},
		{"models.example.com", false, false},
	} {
		if err := CheckBaseURL(tc.url, tc.loopback); (err == nil) != tc.ok {
			t.Errorf("CheckBaseURL(%q, %v) = %v, want ok %v", tc.url, tc.loopback, err, tc.ok)
		}
	}
}

// A response past MaxResponseBytes fails the call (retryable), however
// the endpoint streams it.
func TestAnthropicBoundsTheResponse(t *testing.T) {
	frames := append([]string(nil), toolTurn...)
	srv := newMessagesServer(t, sse(frames...))
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{MaxResponseBytes: 512})
	_, err := a.Generate(context.Background(), testRequest(), nil)
	var me *Error
	if !errors.As(err, &me) || !me.Retryable || !strings.Contains(me.Message, "size bound") {
		t.Fatalf("Generate = %v, want a retryable error naming the bound", err)
	}
}
