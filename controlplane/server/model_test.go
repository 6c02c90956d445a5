package server_test

import (
	"bufio"
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

// TestAnthropicModelRunsATurn runs a session turn end to end on a node whose
// model client is "anthropic", pointed at a local Messages API server.
func TestAnthropicModelRunsATurn(t *testing.T) {
	const key = "sk-ant-e2e-SECRET"
	var (
		mu   sync.Mutex
		reqs []map[string]any
		keys []string
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("model request: %v", err)
		}
		mu.Lock()
		reqs = append(reqs, body)
		keys = append(keys, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, f := range [][2]string{
			{"message_start", `{"type":"message_start","message":{"id":"msg_e2e","type":"message","role":"assistant","model":"claude-test","content":[],"usage":{"input_tokens":12,"output_tokens":1}}}`},
			{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello from "}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the API."}}`},
			{"content_block_stop", `{"type":"content_block_stop","index":0}`},
			{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}`},
			{"message_stop", `{"type":"message_stop"}`},
		} {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", f[0], f[1])
		}
	}))
	defer api.Close()

	srv := servertest.Start(t, pgtest.New(t), server.Config{
		NodeID: "node-a", Model: "anthropic", AnthropicBaseURL: api.URL, AnthropicAPIKey: key,
	})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	agent := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "a", "model": "claude-test", "system": "be brief"})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})
	sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})
	sid := sess["id"].(string)

	stream, err := c.Get(base + "/v1/sessions/" + sid + "/events/stream?beta=true")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	postJSON(t, c, base+"/v1/sessions/"+sid+"/events?beta=true", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{
			map[string]any{"type": "text", "text": "hi"},
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
			map[string]any{"type": "document", "title": "notes", "source": map[string]any{"type": "text", "data": "the plain notes"}},
		}},
	}})

	var kinds []string
	var text string
	var usage map[string]any
	frames := sseFrames(stream.Body)
	deadline := time.After(30 * time.Second)
loop:
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("stream ended after %v", kinds)
			}
			kinds = append(kinds, f.event)
			switch f.event {
			case "agent.message":
				for _, b := range f.data["content"].([]any) {
					text += b.(map[string]any)["text"].(string)
				}
			case "span.model_request_end":
				usage, _ = f.data["model_usage"].(map[string]any)
			case "session.error":
				t.Fatalf("session.error: %v", f.data)
			case "session.status_idle":
				break loop
			}
		case <-deadline:
			t.Fatalf("no idle after %v", kinds)
		}
	}
	if text != "Hello from the API." {
		t.Errorf("agent.message text = %q (frames %v)", text, kinds)
	}
	if usage["input_tokens"] != 12.0 || usage["output_tokens"] != 5.0 {
		t.Errorf("model usage = %v", usage)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(reqs) != 1 {
		t.Fatalf("model API got %d requests, want 1", len(reqs))
	}
	if keys[0] != key {
		t.Errorf("x-api-key = %q", keys[0])
	}
	body, _ := json.Marshal(reqs[0])
	for _, want := range []string{`"model":"claude-test"`, `"text":"be brief"`, `"text":"hi"`, `"stream":true`,
		// The user's image and document reach the model as sent.
		`{"source":{"data":"iVBORw0KGgo=","media_type":"image/png","type":"base64"},"type":"image"}`,
		`{"source":{"data":"the plain notes","media_type":"text/plain","type":"text"},"title":"notes","type":"document"}`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("model request %s lacks %s", body, want)
		}
	}
}

// withKey returns a client that sends key in x-api-key.
func withKey(key string) *http.Client {
	return &http.Client{Transport: keyTransport(key)}
}

type keyTransport string

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("x-api-key", string(k))
	return http.DefaultTransport.RoundTrip(r)
}

func postJSON(t *testing.T, c *http.Client, url string, v any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(v)
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: %v: %s", url, err, raw)
	}
	return out
}

type sseFrame struct {
	event string
	data  map[string]any
}

// sseFrames reads server-sent events from body until it ends.
func sseFrames(body io.Reader) <-chan sseFrame {
	ch := make(chan sseFrame, 256)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 1<<20), 1<<22)
		var f sseFrame
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if f.event != "" && f.event != "ping" {
					ch <- f
				}
				f = sseFrame{}
			case strings.HasPrefix(line, "event: "):
				f.event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[len("data: "):]), &f.data)
			}
		}
	}()
	return ch
}
