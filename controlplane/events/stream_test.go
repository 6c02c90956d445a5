package events_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/policy"
)

// allowTools runs built-in tools by echoing their name, so turns can be long.
type allowTools struct{}

func (allowTools) Run(_ context.Context, _ string, c agentloop.ToolCall) (agentloop.ToolResult, error) {
	return agentloop.ToolResult{Content: []model.Block{{Type: "text", Text: c.Name + " ok"}}}, nil
}

// node is one control-plane node's events stack over a shared database.
type node struct {
	srv  *httptest.Server
	pool *agentloop.Pool
}

func startNode(t testing.TB, st *store.Store) *node {
	t.Helper()
	hub := events.NewHub(st, nil)
	// Its streams write the appends of the store's loops as they commit
	// (with nodes on one store, the last started gets them; the others
	// read them back, as a node does another's).
	st.ObserveAppends(hub.Appended)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() { hub.Run(ctx, ready); close(done) }()
	<-ready
	runner := &agentloop.Loop{
		Store: events.LoopStore{St: st}, Model: model.Fake{}, Tools: allowTools{},
		Previews: events.Previews{St: st}, NewID: store.NewEventID,
	}
	// One node: it always runs the loop.
	pool := agentloop.NewPool(runner, func(c context.Context, sid string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, nil)
	pol, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	z, err := authz.New(pol)
	if err != nil {
		t.Fatal(err)
	}
	h := &publicapi.EventsHandler{Store: st, Hub: hub, Wake: pool.WakeFrom, WriteError: api.WriteError, KeepAlive: 200 * time.Millisecond, Guard: &publicapi.Guard{Authz: z}}
	mux := http.NewServeMux()
	h.Register(mux)
	admin := auth.Principal{Subject: "test", Tenant: tenant.Default, Roles: []string{"admin"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(auth.With(r.Context(), admin)))
	}))
	t.Cleanup(func() {
		st.ObserveAppends(nil)
		srv.CloseClientConnections()
		srv.Close()
		pool.Stop()
		cancel()
		<-done
	})
	return &node{srv: srv, pool: pool}
}

type frame struct {
	id, event string
	data      map[string]any
}

// readFrames reads SSE frames from body and sends them on a channel.
func readFrames(body io.Reader) <-chan frame {
	ch := make(chan frame, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		var f frame
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if f.event != "" {
					ch <- f
				}
				f = frame{}
			case strings.HasPrefix(line, "id: "):
				f.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				f.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &f.data)
			}
		}
	}()
	return ch
}

func openStream(t *testing.T, base, sid, lastID, query string) (*http.Response, <-chan frame) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/sessions/"+sid+"/events/stream?beta=true"+query, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	return resp, readFrames(resp.Body)
}

func post(t *testing.T, base, sid, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/sessions/"+sid+"/events?beta=true", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func message(text string) string {
	b, _ := json.Marshal(map[string]any{"events": []any{map[string]any{"type": "user.message", "content": []any{map[string]string{"type": "text", "text": text}}}}})
	return string(b)
}

func until(t *testing.T, frames <-chan frame, stop func(frame) bool) []frame {
	t.Helper()
	var got []frame
	deadline := time.After(30 * time.Second)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("stream ended after %d frames", len(got))
			}
			if f.event == "ping" {
				continue
			}
			got = append(got, f)
			if stop(f) {
				return got
			}
		case <-deadline:
			t.Fatalf("timed out after %d frames", len(got))
		}
	}
}

func idleEndTurn(f frame) bool {
	if f.event != "session.status_idle" {
		return false
	}
	sr, _ := f.data["stop_reason"].(map[string]any)
	return sr["type"] == "end_turn"
}

func TestStreamDeliversTurnWithPreviews(t *testing.T) {
	h := newHarness(t)
	n := startNode(t, h.st)
	sid := h.CreateSession(t, agentloop.Agent{})
	resp, frames := openStream(t, n.srv.URL, sid, "", "&event_deltas[]=agent.message")
	defer resp.Body.Close()

	if code, body := post(t, n.srv.URL, sid, message("!stream 20")); code != 200 || !strings.Contains(body, `"processed_at":null`) {
		t.Fatalf("send: %d %s", code, body)
	}
	got := until(t, frames, idleEndTurn)
	var kinds []string
	var text strings.Builder
	var msgID, startID string
	for _, f := range got {
		if f.event != "event_delta" {
			kinds = append(kinds, f.event)
		}
		if f.data["type"] != f.event {
			t.Fatalf("frame event %q carries type %v", f.event, f.data["type"])
		}
		switch f.event {
		case "event_start":
			startID = f.data["event"].(map[string]any)["id"].(string)
		case "event_delta":
			text.WriteString(f.data["delta"].(map[string]any)["content"].(map[string]any)["text"].(string))
		case "agent.message":
			msgID = f.id
		}
	}
	want := "user.message session.status_running span.model_request_start event_start agent.message span.model_request_end session.status_idle"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("frames:\n got  %v\n want %s", kinds, want)
	}
	if startID == "" || startID != msgID {
		t.Fatalf("event_start id %q, agent.message id %q: previews must name the message they preview", startID, msgID)
	}
	if !strings.HasSuffix(text.String(), "word20") {
		t.Fatalf("previews spelt %q", text.String())
	}
}

func TestStreamResumeLosesAndDuplicatesNothing(t *testing.T) {
	h := newHarness(t)
	a, b := startNode(t, h.st), startNode(t, h.st)
	var ag agentloop.Agent
	ag.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	sid := h.CreateSession(t, ag)

	resp, frames := openStream(t, a.srv.URL, sid, "", "")
	if code, body := post(t, a.srv.URL, sid, message(strings.Repeat("!tool bash {}\n", 8)+"!reply done")); code != 200 {
		t.Fatalf("send: %d %s", code, body)
	}
	// Read a few frames mid-turn, then drop the connection.
	first := until(t, frames, func(f frame) bool { return f.event == "agent.tool_result" })
	resp.Body.Close()
	last := first[len(first)-1].id

	// Reconnect to the other node with Last-Event-ID.
	resp2, frames2 := openStream(t, b.srv.URL, sid, last, "")
	defer resp2.Body.Close()
	rest := until(t, frames2, idleEndTurn)

	all, err := h.st.Events().List(ctx, sid, store.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var streamed []string
	for _, f := range append(first, rest...) {
		streamed = append(streamed, f.id)
	}
	var stored []string
	for _, e := range all {
		stored = append(stored, e.ID)
	}
	if strings.Join(streamed, " ") != strings.Join(stored, " ") {
		t.Fatalf("streamed %d events, stored %d:\n streamed %v\n stored   %v", len(streamed), len(stored), streamed, stored)
	}
}

func TestSendRejectsBadEvents(t *testing.T) {
	h := newHarness(t)
	n := startNode(t, h.st)
	sid := h.CreateSession(t, agentloop.Agent{})
	tests := []struct{ body, want string }{
		{`{"events":[]}`, "at least one"},
		{`{"events":[{"type":"user.message","content":[]}]}`, "at least one content block"},
		{`{"events":[{"type":"user.dance"}]}`, "not an event a client can send"},
		{`{"events":[{"type":"user.define_outcome","description":"x","rubric":{"type":"text","content":"y"}}]}`, "not supported"},
		{`{"events":[{"type":"user.tool_result","tool_use_id":"x"}]}`, "does not name an event"},
		{`{"events":[{"type":"user.tool_confirmation","tool_use_id":"sevt_nope","result":"allow"}]}`, "does not name an event"},
		{`{"events":[{"type":"user.message","content":[{"type":"text"}]}]}`, "text is required"},
		{`{"events":[{"type":"user.message","content":"hi"}]}`, "expected"},
		{`{"events":`, "not valid JSON"},
	}
	for _, tt := range tests {
		code, body := post(t, n.srv.URL, sid, tt.body)
		if code != 400 || !strings.Contains(body, tt.want) || !strings.Contains(body, `"invalid_request_error"`) {
			t.Errorf("%s: %d %s, want 400 mentioning %q", tt.body, code, body, tt.want)
		}
	}
	if code, body := post(t, n.srv.URL, "sesn_nope", message("hi")); code != 404 {
		t.Errorf("unknown session: %d %s", code, body)
	}
	resp, err := http.Get(n.srv.URL + "/v1/sessions/" + sid + "/events/stream?event_deltas[]=agent.tool_use")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("bad event_deltas: %d", resp.StatusCode)
	}
}

func TestListPaginates(t *testing.T) {
	h := newHarness(t)
	n := startNode(t, h.st)
	sid := h.CreateSession(t, agentloop.Agent{})
	for i := 0; i < 5; i++ {
		h.Send(t, sid, map[string]any{"type": "user.interrupt"})
	}
	for _, order := range []string{"asc", "desc"} {
		var ids []string
		page := ""
		for pages := 0; ; pages++ {
			url := n.srv.URL + "/v1/sessions/" + sid + "/events?beta=true&limit=2&order=" + order
			if page != "" {
				url += "&page=" + page
			}
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Data     []map[string]any `json:"data"`
				NextPage *string          `json:"next_page"`
			}
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			for _, d := range body.Data {
				ids = append(ids, d["id"].(string))
			}
			if body.NextPage == nil {
				break
			}
			page = *body.NextPage
			if pages > 10 {
				t.Fatal("pagination does not end")
			}
		}
		if len(ids) != 5 {
			t.Fatalf("%s: %d events over pages, want 5", order, len(ids))
		}
	}
	// A cursor made for one order is refused with the other.
	resp, _ := http.Get(n.srv.URL + "/v1/sessions/" + sid + "/events?limit=2&order=asc")
	var body struct {
		NextPage string `json:"next_page"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	resp, _ = http.Get(n.srv.URL + "/v1/sessions/" + sid + "/events?limit=2&order=desc&page=" + body.NextPage)
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("cursor reused with another order: %d", resp.StatusCode)
	}
}
