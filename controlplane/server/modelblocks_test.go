package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// messagesAPI is a local Messages API: it answers each request with the
// next of its scripted streams (a plain end_turn text once they run out)
// and records what it was sent.
type messagesAPI struct {
	*httptest.Server
	mu sync.Mutex
	// Fields below guarded by mu.
	scripts [][]string // SSE frames: event name, data, ...
	bodies  [][]byte
	keys    []string
}

func newMessagesAPI(t *testing.T, scripts ...[]string) *messagesAPI {
	t.Helper()
	m := &messagesAPI{scripts: scripts}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		m.mu.Lock()
		m.bodies = append(m.bodies, raw)
		m.keys = append(m.keys, r.Header.Get("X-Api-Key"))
		frames := textReply("done")
		if len(m.scripts) > 0 {
			frames, m.scripts = m.scripts[0], m.scripts[1:]
		}
		m.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i+1 < len(frames); i += 2 {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", frames[i], frames[i+1])
		}
	}))
	t.Cleanup(m.Close)
	return m
}

// requests returns the request bodies so far.
func (m *messagesAPI) requests() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]byte(nil), m.bodies...)
}

const msgStart = `{"type":"message_start","message":{"id":"msg_t","type":"message","role":"assistant","model":"claude-test","content":[],"usage":{"input_tokens":10,"output_tokens":1}}}`

// textReply is a stream of one text block and end_turn.
func textReply(text string) []string {
	return []string{
		"message_start", msgStart,
		"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, text),
		"content_block_stop", `{"type":"content_block_stop","index":0}`,
		"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}`,
		"message_stop", `{"type":"message_stop"}`,
	}
}

// webTurn: thinking with a signature, a web search the provider ran (use
// and encrypted result), text, and a pause.
var webTurn = []string{
	"message_start", msgStart,
	"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Search for it."}}`,
	"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG-e2e-1"}}`,
	"content_block_stop", `{"type":"content_block_stop","index":0}`,
	"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"server_tool_use","id":"srvtoolu_e2e","name":"web_search","input":{}}}`,
	"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"query\":\"gvisor\"}"}}`,
	"content_block_stop", `{"type":"content_block_stop","index":1}`,
	"content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_e2e","content":[{"type":"web_search_result","url":"https://gvisor.dev/","title":"gVisor","encrypted_content":"ENC-e2e","page_age":null}]}}`,
	"content_block_stop", `{"type":"content_block_stop","index":2}`,
	"content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"text","text":""}}`,
	"content_block_delta", `{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"Still searching."}}`,
	"content_block_stop", `{"type":"content_block_stop","index":3}`,
	"message_delta", `{"type":"message_delta","delta":{"stop_reason":"pause_turn"},"usage":{"output_tokens":20}}`,
	"message_stop", `{"type":"message_stop"}`,
}

// webAgentBody is an agent with web_search only (no sandbox tools).
func webAgentBody() map[string]any {
	return map[string]any{"name": "w", "model": "claude-test", "tools": []any{map[string]any{
		"type":           "agent_toolset_20260401",
		"default_config": map[string]any{"enabled": false, "permission_policy": map[string]any{"type": "always_allow"}},
		"configs":        []any{map[string]any{"name": "web_search", "enabled": true}},
	}}}
}

// turn sends text to the session and returns the frames of its stream up
// to the session's idle.
func turn(t *testing.T, c *http.Client, base, sid, text string) []sseFrame {
	t.Helper()
	stream, err := c.Get(base + "/v1/sessions/" + sid + "/events/stream?event_deltas=agent.thinking")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	postJSON(t, c, base+"/v1/sessions/"+sid+"/events", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": text}}},
	}})
	var got []sseFrame
	frames := sseFrames(stream.Body)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("stream ended after %d frames", len(got))
			}
			got = append(got, f)
			if f.event == "session.status_idle" {
				return got
			}
		case <-deadline:
			t.Fatalf("no idle after %d frames", len(got))
		}
	}
}

func frameKinds(fs []sseFrame) string {
	var ks []string
	for _, f := range fs {
		ks = append(ks, f.event)
	}
	return strings.Join(ks, " ")
}

// TestModelBlocksRoundTrip runs, on a node with the anthropic model client
// and thinking on, a turn whose model response thinks, searches the web on
// the provider's side and pauses: the session shows agent.thinking and the
// search as agent.tool_use and agent.tool_result (neither the signature
// nor the encrypted results); the turn continues with the paused response
// sent back block for block; and the next turn's request still carries
// the signature and the search, in order.
func TestModelBlocksRoundTrip(t *testing.T) {
	api := newMessagesAPI(t, webTurn, textReply("Found gVisor."), textReply("You are welcome."))
	srv := servertest.Start(t, pgtest.New(t), server.Config{
		NodeID: "node-a", Model: "anthropic", AnthropicBaseURL: api.URL, AnthropicAPIKey: "sk-ant-e2e", AnthropicThinking: "adaptive",
	})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	// The agent's model has no thinking field: one is refused, not ignored.
	if code, _, body := postStatus(t, c, base+"/v1/agents", map[string]any{"name": "t", "model": map[string]any{"id": "claude-test", "thinking": map[string]any{"type": "enabled", "budget_tokens": 2048}}}); code != http.StatusBadRequest || !strings.Contains(body, "thinking") {
		t.Errorf("an agent's model.thinking: %d %s, want 400 naming it", code, body)
	}
	agent := postJSON(t, c, base+"/v1/agents", webAgentBody())
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})
	sid := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})["id"].(string)

	frames := turn(t, c, base, sid, "find gvisor")
	want := "session.status_running span.model_request_start event_start agent.thinking agent.tool_use agent.tool_result agent.message span.model_request_end " +
		"span.model_request_start agent.message span.model_request_end session.status_idle"
	if got := strings.Replace(frameKinds(frames), "user.message ", "", 1); got != want {
		t.Fatalf("frames:\n%s\nwant\n%s", got, want)
	}
	var useID, thinkingPreview string
	for _, f := range frames {
		switch f.event {
		case "event_start":
			ev, _ := f.data["event"].(map[string]any)
			if ev["type"] != "agent.thinking" {
				t.Errorf("preview of %v, want agent.thinking only", ev)
			}
			thinkingPreview, _ = ev["id"].(string)
		case "agent.thinking":
			if len(f.data) != 3 || f.data["id"] != thinkingPreview {
				t.Errorf("agent.thinking = %v, want id (its preview's, %s), type and processed_at only", f.data, thinkingPreview)
			}
		case "agent.tool_use":
			useID, _ = f.data["id"].(string)
			if f.data["name"] != "web_search" || f.data["evaluated_permission"] != "allow" || fmt.Sprint(f.data["input"]) != "map[query:gvisor]" {
				t.Errorf("agent.tool_use = %v", f.data)
			}
		case "agent.tool_result":
			content, _ := json.Marshal(f.data["content"])
			if f.data["tool_use_id"] != useID || f.data["is_error"] != false || string(content) != `[{"text":"gVisor\nhttps://gvisor.dev/","type":"text"}]` {
				t.Errorf("agent.tool_result = %v", f.data)
			}
		}
	}
	list, err := c.Get(base + "/v1/sessions/" + sid + "/events?limit=100")
	if err != nil {
		t.Fatal(err)
	}
	listed, _ := io.ReadAll(list.Body)
	list.Body.Close()
	for _, secret := range []string{"SIG-e2e-1", "ENC-e2e", "Search for it", "srvtoolu_e2e"} {
		if bytes.Contains(listed, []byte(secret)) {
			t.Errorf("the session's events show %q: %s", secret, listed)
		}
	}

	reqs := api.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want 2 (the pause continued)", len(reqs))
	}
	if !bytes.Contains(reqs[0], []byte(`"thinking":{"type":"adaptive"}`)) {
		t.Errorf("first request lacks the thinking config: %s", reqs[0])
	}
	paused := `{"content":[{"signature":"SIG-e2e-1","thinking":"Search for it.","type":"thinking"},` +
		`{"id":"srvtoolu_e2e","input":{"query":"gvisor"},"name":"web_search","type":"server_tool_use"},` +
		`{"content":[{"encrypted_content":"ENC-e2e","page_age":null,"title":"gVisor","type":"web_search_result","url":"https://gvisor.dev/"}],"tool_use_id":"srvtoolu_e2e","type":"web_search_tool_result"},` +
		`{"text":"Still searching.","type":"text"}`
	if msgs := messagesOf(t, reqs[1]); len(msgs) != 2 || !strings.HasPrefix(msgs[1], paused+`],"role":"assistant"}`) {
		t.Errorf("continuation messages:\n%s\nwant the paused response last, as\n%s", strings.Join(msgs, "\n"), paused)
	}

	turn(t, c, base, sid, "thanks")
	reqs = api.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3", len(reqs))
	}
	msgs := messagesOf(t, reqs[2])
	if len(msgs) != 3 || msgs[1] != paused+`,{"text":"Found gVisor.","type":"text"}],"role":"assistant"}` {
		t.Errorf("next turn's messages:\n%s", strings.Join(msgs, "\n"))
	}
}

// messagesOf returns a request's messages, each as canonical JSON.
func messagesOf(t *testing.T, body []byte) []string {
	t.Helper()
	var req struct {
		Messages []any `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range req.Messages {
		b, _ := json.Marshal(m)
		out = append(out, string(b))
	}
	return out
}
