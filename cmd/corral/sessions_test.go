package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/test/processhost"
)

// cli runs the corral command line in process and returns its output.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// mustCLI is cli that fails the test on an error.
func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cli(t, args...)
	if err != nil {
		t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// api is a tenant's client of the REST API, for what the CLI does not do
// (create agents and sessions, send messages) and to compare with.
type api struct {
	t    *testing.T
	base string
	key  string
}

func (a api) call(method, path string, body any) []byte {
	a.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, r)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("x-api-key", a.key)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != 200 {
		a.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return b
}

func (a api) id(method, path string, body any) string {
	a.t.Helper()
	var v struct{ ID string }
	if err := json.Unmarshal(a.call(method, path, body), &v); err != nil || v.ID == "" {
		a.t.Fatalf("%s %s: no id (%v)", method, path, err)
	}
	return v.ID
}

// startProcessHost joins a process-runtime host agent id to srv.
func startProcessHost(t *testing.T, srv *server.Server, id string) {
	t.Helper()
	processhost.Start(t, srv, id, nil)
}

// lines sends each line written to the returned writer on the channel.
func lines() (io.WriteCloser, <-chan string) {
	pr, pw := io.Pipe()
	ch := make(chan string, 1000)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<22)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return pw, ch
}

// runTail runs `corral sessions tail id args...` until ctx ends: the lines
// of its output and of its standard error, and its error when it ends.
func runTail(ctx context.Context, id string, args ...string) (out, status <-chan string, done <-chan error) {
	outW, out := lines()
	errW, status := lines()
	ch := make(chan error, 1)
	go func() {
		root := newRootCommand()
		root.SetOut(outW)
		root.SetErr(errW)
		root.SetArgs(append([]string{"sessions", "tail", id}, args...))
		ch <- root.ExecuteContext(ctx)
		outW.Close()
		errW.Close()
	}()
	return out, status, ch
}

// waitLine waits for a line of ch containing want and returns it.
func waitLine(t *testing.T, ch <-chan string, what, want string) string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case l, ok := <-ch:
			if !ok {
				t.Fatalf("%s: the output ended before a line with %q", what, want)
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			t.Fatalf("%s: no line with %q in a minute", what, want)
		}
	}
}

// The tenant verbs against a real control plane and a real (process)
// host: sessions and agents listed (across pages) and shown in both
// formats, a live turn followed by tail, where the session runs shown to
// an operator only, an unknown id refused, and a delete.
func TestSessionVerbs(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	startProcessHost(t, srv, "host-a")
	key := servertest.TenantKey(t, srv, tenant.Default)
	opKey := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr()
	t.Setenv("CORRAL_URL", base)
	t.Setenv("CORRAL_API_KEY", key)
	t.Setenv("CORRAL_GRPC_ADDR", srv.GRPCAddr())
	t.Setenv("CORRAL_OPERATOR_KEY", "")
	a := api{t: t, base: base, key: key}

	agentID := a.id("POST", "/v1/agents", map[string]any{"name": "cli-agent", "model": "fake", "tools": []any{map[string]any{
		"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}},
	}}})
	envID := a.id("POST", "/v1/environments", map[string]any{"name": "cli-env"})
	var sessions []string
	for i := range 3 {
		sessions = append(sessions, a.id("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "title": fmt.Sprintf("cli %d", i)}))
	}

	// ls follows the pages: one a page here, all three listed, newest first.
	out := mustCLI(t, "sessions", "ls", "--page-size", "1")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 4 || !strings.HasPrefix(rows[0], "ID") || !strings.HasPrefix(rows[1], sessions[2]) || !strings.HasPrefix(rows[3], sessions[0]) ||
		!strings.Contains(rows[1], agentID) || !strings.Contains(rows[1], "cli 2") || !strings.Contains(rows[1], "idle") {
		t.Fatalf("sessions ls:\n%s", out)
	}
	if rows := strings.Split(strings.TrimSpace(mustCLI(t, "sessions", "ls", "--page-size", "1", "--limit", "2")), "\n"); len(rows) != 3 {
		t.Fatalf("sessions ls --limit 2: %d rows", len(rows)-1)
	}
	// --output json is the API's objects, as an array.
	var listed []map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "sessions", "ls", "-o", "json", "--page-size", "2")), &listed); err != nil || len(listed) != 3 {
		t.Fatalf("sessions ls -o json: %d sessions, %v", len(listed), err)
	}
	var direct map[string]any
	_ = json.Unmarshal(a.call("GET", "/v1/sessions/"+sessions[0], nil), &direct)
	if listed[2]["id"] != sessions[0] || listed[2]["type"] != "session" || listed[2]["agent"].(map[string]any)["id"] != agentID ||
		listed[2]["environment_id"] != direct["environment_id"] || listed[2]["created_at"] != direct["created_at"] {
		t.Fatalf("sessions ls -o json: %v\nAPI: %v", listed[2], direct)
	}

	// tail, started before the turn, shows the turn's events as they come.
	id := sessions[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tailLines, tailStatus, tailDone := runTail(ctx, id)
	waitLine(t, tailStatus, "tail", "following session "+id)
	a.call("POST", "/v1/sessions/"+id+"/events", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tool bash {"command":"echo from-the-sandbox"}`}}},
	}})
	waitLine(t, tailLines, "tail", "user.message")
	if l := waitLine(t, tailLines, "tail", "agent.tool_use"); !strings.Contains(l, "bash") || !strings.Contains(l, "from-the-sandbox") {
		t.Fatalf("tail's tool use line: %s", l)
	}
	if l := waitLine(t, tailLines, "tail", "agent.tool_result"); !strings.Contains(l, "from-the-sandbox") {
		t.Fatalf("tail's tool result line: %s", l)
	}
	waitLine(t, tailLines, "tail", "session.status_idle")

	// events lists the log: the table, and the API's JSON.
	out = mustCLI(t, "sessions", "events", id, "--page-size", "2")
	if !strings.HasPrefix(out, "ID") || !strings.Contains(out, "user.message") || !strings.Contains(out, "agent.tool_use") || !strings.Contains(out, "session.status_idle") {
		t.Fatalf("sessions events:\n%s", out)
	}
	var evs []map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "sessions", "events", id, "-o", "json", "--page-size", "3")), &evs); err != nil {
		t.Fatal(err)
	}
	var page struct{ Data []map[string]any }
	_ = json.Unmarshal(a.call("GET", "/v1/sessions/"+id+"/events?limit=1000", nil), &page)
	if len(evs) == 0 || len(evs) != len(page.Data) || evs[0]["id"] != page.Data[0]["id"] || evs[len(evs)-1]["id"] != page.Data[len(evs)-1]["id"] {
		t.Fatalf("sessions events -o json: %d events, the API lists %d", len(evs), len(page.Data))
	}

	// get: without an operator key, where it runs is not shown.
	out = mustCLI(t, "sessions", "get", id)
	for _, want := range []string{"ID:", id, "cli 0", "Agent:", agentID, "Runner node:", "Sandbox host:", "Sandbox provider:", needsOperator} {
		if !strings.Contains(out, want) {
			t.Fatalf("sessions get without an operator key: no %q in\n%s", want, out)
		}
	}
	// With one: the runner node and the sandbox's host and provider.
	t.Setenv("CORRAL_OPERATOR_KEY", opKey)
	out = mustCLI(t, "sessions", "get", id)
	t.Logf("sessions get:\n%s", out)
	for _, want := range []string{"node-a", "host-a", "process"} {
		if !strings.Contains(out, want) {
			t.Fatalf("sessions get with an operator key: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, needsOperator) {
		t.Fatalf("sessions get with an operator key:\n%s", out)
	}
	// A session that never ran has no runner and no sandbox.
	if out := mustCLI(t, "sessions", "get", sessions[1]); !strings.Contains(out, "(no sandbox)") {
		t.Fatalf("sessions get of an idle session:\n%s", out)
	}
	t.Setenv("CORRAL_OPERATOR_KEY", "")
	// -o json is the API's object, unchanged.
	var got, want map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "sessions", "get", id, "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(a.call("GET", "/v1/sessions/"+id, nil), &want)
	delete(got, "stats") // duration_seconds grows between the two reads
	delete(want, "stats")
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if !bytes.Equal(gb, wb) {
		t.Fatalf("sessions get -o json:\n%s\nthe API:\n%s", gb, wb)
	}

	// agents ls and get.
	out = mustCLI(t, "agents", "ls")
	if rows := strings.Split(strings.TrimSpace(out), "\n"); len(rows) != 2 || !strings.HasPrefix(rows[1], agentID) || !strings.Contains(rows[1], "cli-agent") || !strings.Contains(rows[1], "fake") {
		t.Fatalf("agents ls:\n%s", out)
	}
	// Byte for byte what the API sent (an agent does not change between
	// reads, unlike a session's stats).
	var agentPage struct{ Data []json.RawMessage }
	_ = json.Unmarshal(a.call("GET", "/v1/agents", nil), &agentPage)
	if out, want := mustCLI(t, "agents", "ls", "-o", "json"), "["+string(agentPage.Data[0])+"]\n"; out != want {
		t.Fatalf("agents ls -o json:\n%s\nthe API's:\n%s", out, want)
	}
	if out := mustCLI(t, "agents", "get", agentID); !strings.Contains(out, "cli-agent") || !strings.Contains(out, "Model:") || !strings.Contains(out, "agent_toolset_20260401") {
		t.Fatalf("agents get:\n%s", out)
	}
	var ag map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "agents", "get", agentID, "-o", "json")), &ag); err != nil || ag["id"] != agentID || ag["type"] != "agent" {
		t.Fatalf("agents get -o json: %v %v", ag, err)
	}

	// An unknown id is "not found", for every verb that takes one.
	for _, args := range [][]string{
		{"sessions", "get", "sesn_nope"}, {"sessions", "events", "sesn_nope"}, {"sessions", "delete", "sesn_nope"},
		{"sessions", "tail", "sesn_nope"}, {"agents", "get", "agent_nope"},
	} {
		if _, err := cli(t, args...); err == nil || !strings.HasSuffix(err.Error(), "nope: not found") {
			t.Fatalf("corral %s: %v", strings.Join(args, " "), err)
		}
	}
	// A bad key is the API's refusal, in one line.
	t.Setenv("CORRAL_API_KEY", "crl_nope")
	if _, err := cli(t, "sessions", "ls"); err == nil || !strings.HasPrefix(err.Error(), "listing sessions: ") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("sessions ls with a bad key: %v", err)
	}
	t.Setenv("CORRAL_API_KEY", key)

	// delete: the session is gone, and the tail following it ends.
	if out := mustCLI(t, "sessions", "delete", id); strings.TrimSpace(out) != "session "+id+" deleted" {
		t.Fatalf("sessions delete: %q", out)
	}
	if err := waitfor.Chan(t, time.Minute, "tail to end with the deleted session", tailDone); err != nil {
		t.Fatalf("tail: %v", err)
	}
	if _, err := cli(t, "sessions", "get", id); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("get after delete: %v", err)
	}
	if rows := strings.Split(strings.TrimSpace(mustCLI(t, "sessions", "ls")), "\n"); len(rows) != 3 {
		t.Fatalf("sessions ls after a delete: %d rows", len(rows)-1)
	}
}

// dropOnce is a proxy to the API that ends the first event stream through
// it right after its first event, and records the Last-Event-ID of each
// stream asked for.
type dropOnce struct {
	upstream string
	mu       sync.Mutex
	streams  []string // Last-Event-ID of each stream request
}

func (d *dropOnce) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, d.upstream+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	if !strings.HasSuffix(r.URL.Path, "/events/stream") {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	d.mu.Lock()
	d.streams = append(d.streams, r.Header.Get("Last-Event-ID"))
	first := len(d.streams) == 1
	d.mu.Unlock()
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<22)
	sawID := false
	for sc.Scan() {
		fmt.Fprintf(w, "%s\n", sc.Bytes())
		_ = rc.Flush()
		sawID = sawID || strings.HasPrefix(sc.Text(), "id: ")
		if first && sawID && sc.Text() == "" {
			return // the stream drops after its first event
		}
	}
}

// A stream that drops is resumed with Last-Event-ID: tail shows every
// event of the turn once and in order, those appended while it was not
// connected included.
func TestTailResumesADroppedStream(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a"})
	key := servertest.TenantKey(t, srv, tenant.Default)
	base := "http://" + srv.HTTPAddr()
	proxy := &dropOnce{upstream: base}
	ps := httptest.NewServer(proxy)
	defer ps.Close()
	t.Setenv("CORRAL_URL", ps.URL)
	t.Setenv("CORRAL_API_KEY", key)
	a := api{t: t, base: base, key: key}
	agentID := a.id("POST", "/v1/agents", map[string]any{"name": "a", "model": "fake"})
	envID := a.id("POST", "/v1/environments", map[string]any{"name": "e"})
	id := a.id("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tailLines, tailStatus, tailDone := runTail(ctx, id, "-o", "json")
	waitLine(t, tailStatus, "tail", "following session "+id)
	a.call("POST", "/v1/sessions/"+id+"/events", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "hello"}}},
	}})
	waitLine(t, tailStatus, "tail", "following session "+id+" after ")

	var got []string
	seen := map[string]bool{}
	for {
		l := waitLine(t, tailLines, "tail", "{")
		var e struct{ ID, Type string }
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("tail -o json printed %q: %v", l, err)
		}
		if seen[e.ID] {
			t.Fatalf("event %s (%s) shown twice", e.ID, e.Type)
		}
		seen[e.ID] = true
		got = append(got, e.ID)
		if e.Type == "session.status_idle" {
			break
		}
	}
	var page struct{ Data []struct{ ID string } }
	_ = json.Unmarshal(a.call("GET", "/v1/sessions/"+id+"/events", nil), &page)
	var want []string
	for _, e := range page.Data {
		want = append(want, e.ID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("tail showed %v\nthe log has %v", got, want)
	}
	proxy.mu.Lock()
	streams := append([]string(nil), proxy.streams...)
	proxy.mu.Unlock()
	if len(streams) != 2 || streams[0] != "" || streams[1] != want[0] {
		t.Fatalf("stream requests' Last-Event-ID: %q, want \"\" then %s", streams, want[0])
	}
	cancel()
	if err := waitfor.Chan(t, time.Minute, "tail to stop when interrupted", tailDone); err != nil {
		t.Fatalf("tail: %v", err)
	}
}

// A stream's line longer than the bound is refused, not buffered; frames
// before it are shown, pings and previews are not.
func TestTailBoundsItsLines(t *testing.T) {
	r := &restConn{output: "json"}
	var out bytes.Buffer
	var last string
	body := io.MultiReader(
		strings.NewReader("event: ping\ndata: {\"type\":\"ping\"}\n\nid: sevt_1\nevent: user.message\ndata: {\"id\":\"sevt_1\",\"type\":\"user.message\"}\n\n"+
			"event: event_delta\ndata: {\"type\":\"event_delta\"}\n\ndata: "),
		io.LimitReader(neverEnding('x'), maxSSELineBytes+1))
	n, done, err := r.readStream(body, &out, &last)
	if n != 1 || done || !errors.Is(err, errLineTooLong) || last != "sevt_1" || out.String() != "{\"id\":\"sevt_1\",\"type\":\"user.message\"}\n" {
		t.Fatalf("readStream: %d events, done %v, err %v, last %q, out %q", n, done, err, last, out.String())
	}
}

// neverEnding is an endless stream of one byte.
type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
