package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/internal/logging"
)

const testKey = "sk-ant-test-SECRET-0123456789"

// messagesServer is a local stand-in for the Messages API: it records each
// request and answers with the handler's reply.
type messagesServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []recorded
}

type recorded struct {
	Path   string
	Header http.Header
	Body   map[string]any
}

func newMessagesServer(t *testing.T, reply http.HandlerFunc) *messagesServer {
	t.Helper()
	s := &messagesServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("request body is not JSON: %v: %s", err, raw)
		}
		s.mu.Lock()
		s.requests = append(s.requests, recorded{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		s.mu.Unlock()
		reply(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *messagesServer) only(t *testing.T) recorded {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) != 1 {
		t.Fatalf("server got %d requests, want 1", len(s.requests))
	}
	return s.requests[0]
}

// sse writes frames as the Messages API streams them: "event: NAME" and one
// data line of JSON each.
func sse(frames ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := 0; i+1 < len(frames); i += 2 {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", frames[i], frames[i+1])
			w.(http.Flusher).Flush()
		}
	}
}

func jsonError(status int, typ, msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("request-id", "req_test")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%q}}`, typ, msg)
	}
}

// toolTurn is a full stream: text, then a tool call whose input arrives in
// pieces, with a ping between.
var toolTurn = []string{
	"message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1,"cache_creation_input_tokens":7,"cache_read_input_tokens":11}}}`,
	"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
	"ping", `{"type":"ping"}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me "}}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"check."}}`,
	"content_block_stop", `{"type":"content_block_stop","index":0}`,
	"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`,
	"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`,
	"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Pa"}}`,
	"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"ris\"}"}}`,
	"content_block_stop", `{"type":"content_block_stop","index":1}`,
	"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}`,
	"message_stop", `{"type":"message_stop"}`,
}

func testRequest() Request {
	return Request{
		Model:  "claude-test",
		System: "You are terse.",
		Messages: []Message{
			{Role: "user", Content: []Block{{Type: "text", Text: "weather?"}}},
			{Role: "assistant", Content: []Block{{Type: "tool_use", ID: "toolu_0", Name: "get_weather", Input: json.RawMessage(`{"city":"Oslo"}`)}}},
			{Role: "user", Content: []Block{{Type: "tool_result", ToolUseID: "toolu_0", IsError: true, Content: []Block{{Type: "text", Text: "no data"}}}}},
		},
		Tools: []Tool{{
			Name:        "get_weather",
			Description: "Weather by city",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`),
		}, {Name: "web_search", Server: ServerWebSearch}, {Name: "web_fetch", Server: ServerWebFetch}},
		MaxTokens: 1234,
	}
}

func newTestAnthropic(t *testing.T, url string, cfg AnthropicConfig) *Anthropic {
	t.Helper()
	cfg.BaseURL = url
	if cfg.APIKey == "" && cfg.AuthToken == "" {
		cfg.APIKey = testKey
	}
	a, err := NewAnthropic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type delta struct {
	Index int
	Text  string
}

func TestAnthropicStreamsATurn(t *testing.T) {
	srv := newMessagesServer(t, sse(toolTurn...))
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{})

	var deltas []delta
	resp, err := a.Generate(context.Background(), testRequest(), func(i int, s string) { deltas = append(deltas, delta{i, s}) })
	if err != nil {
		t.Fatal(err)
	}

	if want := []delta{{0, "Let me "}, {0, "check."}}; !reflect.DeepEqual(deltas, want) {
		t.Errorf("deltas = %v, want %v", deltas, want)
	}
	if len(resp.Content) != 2 {
		t.Fatalf("content = %+v, want a text and a tool_use block", resp.Content)
	}
	if b := resp.Content[0]; b.Type != "text" || b.Text != "Let me check." {
		t.Errorf("block 0 = %+v", b)
	}
	b := resp.Content[1]
	if b.Type != "tool_use" || b.ID != "toolu_1" || b.Name != "get_weather" {
		t.Errorf("block 1 = %+v", b)
	}
	var input map[string]string
	if err := json.Unmarshal(b.Input, &input); err != nil || input["city"] != "Paris" {
		t.Errorf("tool input = %s (%v), want city Paris", b.Input, err)
	}
	if resp.StopReason != "tool_use" {
		t.Errorf("stop reason = %q", resp.StopReason)
	}
	if want := (Usage{InputTokens: 25, OutputTokens: 42, CacheCreationInputTokens: 7, CacheReadInputTokens: 11}); resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}

	got := srv.only(t)
	if got.Path != "/v1/messages" {
		t.Errorf("path = %s", got.Path)
	}
	if h := got.Header.Get("X-Api-Key"); h != testKey {
		t.Errorf("x-api-key = %q", h)
	}
	if h := got.Header.Get("Authorization"); h != "" {
		t.Errorf("authorization = %q, want none with an API key", h)
	}
	if got.Header.Get("Anthropic-Version") == "" {
		t.Error("no anthropic-version header")
	}
	wantBody := map[string]any{
		"model":      "claude-test",
		"max_tokens": 1234.0,
		"stream":     true,
		"system":     []any{map[string]any{"type": "text", "text": "You are terse."}},
		"messages": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "weather?"}}},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": map[string]any{"city": "Oslo"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{
				"type": "tool_result", "tool_use_id": "toolu_0", "is_error": true,
				"content": []any{map[string]any{"type": "text", "text": "no data"}},
			}}},
		},
		"tools": []any{map[string]any{
			"name":        "get_weather",
			"description": "Weather by city",
			"input_schema": map[string]any{
				"type":                 "object",
				"properties":           map[string]any{"city": map[string]any{"type": "string"}},
				"required":             []any{"city"},
				"additionalProperties": false,
			},
		}, map[string]any{"type": "web_search_20250305", "name": "web_search"}, map[string]any{"type": "web_fetch_20250910", "name": "web_fetch"}},
	}
	if !reflect.DeepEqual(got.Body, wantBody) {
		gb, _ := json.MarshalIndent(got.Body, "", "  ")
		wb, _ := json.MarshalIndent(wantBody, "", "  ")
		t.Errorf("request body:\n%s\nwant:\n%s", gb, wb)
	}
}

func TestAnthropicBearerTokenAndDefaultModel(t *testing.T) {
	srv := newMessagesServer(t, sse(
		"message_start", `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}`,
		"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}`,
		"content_block_stop", `{"type":"content_block_stop","index":0}`,
		"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"hi"}}`,
		"content_block_stop", `{"type":"content_block_stop","index":1}`,
		"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}`,
		"message_stop", `{"type":"message_stop"}`,
	))
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{AuthToken: "tok-SECRET", DefaultModel: "claude-default"})
	var deltas []delta
	resp, err := a.Generate(context.Background(), Request{Messages: []Message{{Role: "user", Content: []Block{{Type: "text", Text: "hello"}}}}}, func(i int, s string) { deltas = append(deltas, delta{i, s}) })
	if err != nil {
		t.Fatal(err)
	}
	// The thinking block is kept (it goes back to the model), so the
	// text block is index 1 of Response.Content and its deltas say so;
	// the thinking's start is marked, its text never sent.
	if want := []delta{{0, ""}, {1, "hi"}}; !reflect.DeepEqual(deltas, want) {
		t.Errorf("deltas = %v, want %v", deltas, want)
	}
	if len(resp.Content) != 2 || resp.Content[0].Thinking != "hmm" || resp.Content[1].Text != "hi" || resp.StopReason != "end_turn" {
		t.Errorf("response = %+v", resp)
	}
	got := srv.only(t)
	if h := got.Header.Get("Authorization"); h != "Bearer tok-SECRET" {
		t.Errorf("authorization = %q", h)
	}
	if h := got.Header.Get("X-Api-Key"); h != "" {
		t.Errorf("x-api-key = %q, want none with a token", h)
	}
	if got.Body["model"] != "claude-default" || got.Body["max_tokens"] != 4096.0 {
		t.Errorf("model, max_tokens = %v, %v", got.Body["model"], got.Body["max_tokens"])
	}
	if _, ok := got.Body["system"]; ok {
		t.Error("system sent although empty")
	}
}

func TestAnthropicErrors(t *testing.T) {
	midStream := func(typ string) http.HandlerFunc {
		return sse(
			"message_start", `{"type":"message_start","message":{"id":"msg_3","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}`,
			"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"par"}}`,
			"error", fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":"stream broke"}}`, typ),
		)
	}
	for _, tc := range []struct {
		name      string
		reply     http.HandlerFunc
		typ       string
		retryable bool
		contains  string
	}{
		{"overloaded 529", jsonError(529, "overloaded_error", "Overloaded"), "model_overloaded_error", true, "Overloaded"},
		{"rate limited 429", jsonError(429, "rate_limit_error", "slow down"), "model_rate_limited_error", true, "slow down"},
		{"server error 500", jsonError(500, "api_error", "internal"), "model_request_failed_error", true, "HTTP 500"},
		{"unauthorized 401", jsonError(401, "authentication_error", "invalid x-api-key "+testKey), "model_request_failed_error", false, "authentication failed"},
		{"forbidden 403", jsonError(403, "permission_error", "no"), "model_request_failed_error", false, "authentication failed"},
		{"bad request 400", jsonError(400, "invalid_request_error", "max_tokens: too large"), "model_request_failed_error", false, "max_tokens: too large"},
		{"mid-stream overloaded", midStream("overloaded_error"), "model_overloaded_error", true, "stream broke"},
		{"mid-stream api error", midStream("api_error"), "model_request_failed_error", true, "stream broke"},
		{"stream cut short", sse(toolTurn[:len(toolTurn)-4]...), "model_request_failed_error", true, "ended before message_stop"},
		{"not json", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(502)
			io.WriteString(w, "<html>bad gateway</html>")
		}, "model_request_failed_error", true, "HTTP 502"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newMessagesServer(t, tc.reply)
			a := newTestAnthropic(t, srv.URL, AnthropicConfig{})
			_, err := a.Generate(context.Background(), testRequest(), nil)
			var me *Error
			if !errors.As(err, &me) {
				t.Fatalf("err = %v (%T), want *model.Error", err, err)
			}
			if me.Type != tc.typ || me.Retryable != tc.retryable {
				t.Errorf("err = %+v, want type %s retryable %v", me, tc.typ, tc.retryable)
			}
			if !strings.Contains(me.Message, tc.contains) {
				t.Errorf("message %q does not contain %q", me.Message, tc.contains)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("error leaks the API key: %v", err)
			}
			// The SDK does not retry on its own: the loop does.
			srv.only(t)
		})
	}
}

func TestAnthropicCancel(t *testing.T) {
	started := make(chan struct{})
	srv := newMessagesServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{}}}\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	})
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	_, err := a.Generate(ctx, testRequest(), nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestAnthropicConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  AnthropicConfig
		want string
	}{
		{"no credentials", AnthropicConfig{}, "an API key or an auth token is required"},
		{"both", AnthropicConfig{APIKey: testKey, AuthToken: "tok"}, "not both"},
		{"negative retries", AnthropicConfig{APIKey: testKey, MaxRetries: -1}, "max retries"},
		{"bad url", AnthropicConfig{APIKey: testKey, BaseURL: "ftp://x"}, "must start with http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewAnthropic(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("error leaks the key: %v", err)
			}
		})
	}
	if _, err := NewAnthropic(AnthropicConfig{APIKey: logging.Secret(testKey)}); err != nil {
		t.Fatal(err)
	}
}

func TestAnthropicTimeoutIsRetryable(t *testing.T) {
	srv := newMessagesServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never answers
	})
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{Timeout: 50 * time.Millisecond})
	_, err := a.Generate(context.Background(), testRequest(), nil)
	var me *Error
	if !errors.As(err, &me) || me.Type != "model_request_failed_error" || !me.Retryable || !strings.Contains(me.Message, "did not finish") {
		t.Fatalf("err = %v, want a retryable model_request_failed_error for the timeout", err)
	}
}

// A response that stops with a refusal carries its stop details: the
// category and explanation the model gave, or none.
func TestAnthropicRefusal(t *testing.T) {
	for _, tt := range []struct {
		details string
		want    Refusal
	}{
		{`{"type":"refusal","category":"cyber","explanation":"not this"}`, Refusal{Category: "cyber", Explanation: "not this"}},
		{`{"type":"refusal","category":null,"explanation":null}`, Refusal{}},
	} {
		srv := newMessagesServer(t, sse(
			"message_start", `{"type":"message_start","message":{"id":"msg_3","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}`,
			"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"I can't"}}`,
			"content_block_stop", `{"type":"content_block_stop","index":0}`,
			"message_delta", `{"type":"message_delta","delta":{"stop_reason":"refusal","stop_details":`+tt.details+`},"usage":{"output_tokens":2}}`,
			"message_stop", `{"type":"message_stop"}`,
		))
		a := newTestAnthropic(t, srv.URL, AnthropicConfig{DefaultModel: "m"})
		resp, err := a.Generate(context.Background(), testRequest(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StopReason != "refusal" || resp.Refusal == nil || *resp.Refusal != tt.want || len(resp.Content) != 1 {
			t.Errorf("%s: response %+v (refusal %+v)", tt.details, resp, resp.Refusal)
		}
	}
}

// The web server tools go to the API with the options the agent set.
func TestAnthropicWebToolOptions(t *testing.T) {
	srv := newMessagesServer(t, sse(
		"message_start", `{"type":"message_start","message":{"id":"msg_4","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}`,
		"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}`,
		"message_stop", `{"type":"message_stop"}`,
	))
	a := newTestAnthropic(t, srv.URL, AnthropicConfig{DefaultModel: "m"})
	req := testRequest()
	req.Tools = []Tool{
		{Name: "web_fetch", Server: ServerWebFetch, Web: &WebOptions{AllowedDomains: []string{"docs.example.com"}, MaxContentTokens: 5000}},
		{Name: "web_search", Server: ServerWebSearch, Web: &WebOptions{BlockedDomains: []string{"spam.example"}, UserLocation: &UserLocation{Type: "approximate", City: "Paris", Country: "FR"}}},
		{Name: "web_search2", Server: ServerWebSearch},
	}
	if _, err := a.Generate(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(srv.only(t).Body["tools"])
	for _, want := range []string{
		`"allowed_domains":["docs.example.com"]`, `"max_content_tokens":5000`, `"type":"web_fetch_20250910"`,
		`"blocked_domains":["spam.example"]`, `"user_location":{"city":"Paris","country":"FR","type":"approximate"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("tools sent %s, want %s in them", body, want)
		}
	}
	if strings.Count(string(body), "allowed_domains") != 1 || strings.Count(string(body), "user_location") != 1 {
		t.Errorf("a web tool without options was sent with some: %s", body)
	}
}
