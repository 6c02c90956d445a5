package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/lib/environments"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// workerSetup starts a node with a short work lease and no host at all (a
// self-hosted session needs none: a sandbox asked for would fail the turn)
// and returns a tenant client, a self-hosted environment and an
// environment key for it.
type workerSetup struct {
	srv    *server.Server
	client anthropic.Client
	envID  string
	key    string
	agent  string
}

func setupWorker(t *testing.T, lease time.Duration) workerSetup {
	t.Helper()
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-worker", WorkLeaseTTL: lease})
	tenantKey := servertest.TenantKey(t, srv, tenant.Default)
	client := anthropic.NewClient(
		option.WithBaseURL("http://"+srv.HTTPAddr()),
		option.WithAPIKey(tenantKey),
		option.WithRequestTimeout(30*time.Second),
	)
	ctx := context.Background()
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{
		Name:   "self-hosted",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfSelfHosted: &anthropic.BetaSelfHostedConfigParams{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if env.Config.Type != "self_hosted" {
		t.Fatalf("environment config = %s, want self_hosted", env.Config.RawJSON())
	}
	key := environmentKey(t, srv, tenantKey, env.ID)
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "worker",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return workerSetup{srv: srv, client: client, envID: env.ID, key: key, agent: agent.ID}
}

// cutTransport fails every request once cut: the worker's process is gone
// as far as corral can tell (no stop, no result, no heartbeat reaches it).
type cutTransport struct{ cut atomic.Bool }

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("the worker was killed")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// worker runs the official SDK's EnvironmentWorker, unchanged, in dir.
type worker struct {
	cancel context.CancelFunc
	done   chan error
	cut    *cutTransport
}

func startWorker(t *testing.T, w workerSetup, name, dir string) *worker {
	t.Helper()
	cut := &cutTransport{}
	client := anthropic.NewClient(
		option.WithBaseURL("http://"+w.srv.HTTPAddr()),
		option.WithHTTPClient(&http.Client{Transport: cut}),
		option.WithRequestTimeout(30*time.Second),
	)
	maxIdle := 500 * time.Millisecond
	ew := environments.NewEnvironmentWorker(client, environments.EnvironmentWorkerOptions{
		EnvironmentID:      w.envID,
		EnvironmentKey:     w.key,
		WorkerID:           name,
		Workdir:            dir,
		MaxIdle:            &maxIdle,
		MemorySyncInterval: -1,
		Logger:             slog.New(slog.NewTextHandler(testWriter{t, name}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	ctx, cancel := context.WithCancel(context.Background())
	wk := &worker{cancel: cancel, done: make(chan error, 1), cut: cut}
	go func() { wk.done <- ew.Run(ctx) }()
	t.Cleanup(func() { wk.stop(t) })
	return wk
}

// stop cancels the worker and waits for its Run to return.
func (wk *worker) stop(t *testing.T) {
	t.Helper()
	wk.cancel()
	select {
	case err, ok := <-wk.done:
		if ok && err != nil {
			t.Errorf("worker: %v", err)
		}
		if ok {
			close(wk.done)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the worker did not stop within 90s")
	}
}

type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s: %s", w.name, strings.TrimSpace(string(p)))
	return len(p), nil
}

// untilTurnEnds reads s until the session idles with a stop reason other
// than requires_action.
func untilTurnEnds(t *testing.T, s stream) []anthropic.BetaManagedAgentsStreamSessionEventsUnion {
	t.Helper()
	var got []anthropic.BetaManagedAgentsStreamSessionEventsUnion
	for s.Next() {
		e := s.Current()
		decodedCleanly(t, "stream "+e.Type, e)
		got = append(got, e)
		if e.Type == "session.status_idle" && e.StopReason.Type != "requires_action" {
			return got
		}
	}
	t.Fatalf("stream ended before the turn did (after %d events: %s): %v", len(got), typesOf(got), s.Err())
	return nil
}

// toolResults returns the text of the session's user.tool_result events.
func toolResults(t *testing.T, w workerSetup, sessionID string) map[string][]string {
	t.Helper()
	page, err := w.client.Beta.Sessions.Events.List(context.Background(), sessionID, anthropic.BetaSessionEventListParams{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, raw := range page.Data {
		var e struct {
			Type      string `json:"type"`
			ToolUseID string `json:"tool_use_id"`
			Content   []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if err := json.Unmarshal([]byte(raw.RawJSON()), &e); err != nil {
			t.Fatal(err)
		}
		switch e.Type {
		case "agent.tool_result":
			t.Errorf("corral ran tool call %s itself: %s", e.ToolUseID, raw.RawJSON())
		case "user.tool_result":
			var text []string
			for _, c := range e.Content {
				text = append(text, c.Text)
			}
			out[e.ToolUseID] = append(out[e.ToolUseID], strings.Join(text, ""))
		}
	}
	return out
}

// The official SDK's EnvironmentWorker runs a self-hosted session's bash
// call in its own directory and the result reaches the model.
func TestSelfHostedWorkerRunsTools(t *testing.T) {
	w := setupWorker(t, 120*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	startWorker(t, w, "worker-1", dir)

	sess, err := w.client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(w.agent)}, EnvironmentID: w.envID,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := w.client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	if _, err := w.client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{
		Events: []anthropic.BetaManagedAgentsEventParamsUnion{say("!tool bash {\"command\":\"pwd; echo hi > f\"}\n!echo")},
	}); err != nil {
		t.Fatal(err)
	}
	evs := untilTurnEnds(t, s)
	if !strings.Contains(typesOf(evs), "agent.tool_use") || !strings.Contains(typesOf(evs), "user.tool_result") {
		t.Fatalf("events: %s", typesOf(evs))
	}
	b, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil || string(b) != "hi\n" {
		t.Fatalf("the worker's directory has f = %q, %v; want hi", b, err)
	}
	results := toolResults(t, w, sess.ID)
	if len(results) != 1 {
		t.Fatalf("tool results: %v, want one", results)
	}
	for _, r := range results {
		if len(r) != 1 || !strings.Contains(r[0], dir) {
			t.Fatalf("tool result %q: want one, naming the worker's directory %s", r, dir)
		}
	}
	// !echo answers with the tool results it was sent: the model saw it.
	var said string
	for _, e := range evs {
		if e.Type == "agent.message" {
			said += e.RawJSON()
		}
	}
	if !strings.Contains(said, dir) {
		t.Fatalf("the model said %q; want the bash output (%s)", said, dir)
	}

	// A later turn, whether the worker still holds the session or has let
	// it go after its idle time (new input then queues it again), runs
	// in the same directory.
	if _, err := w.client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{
		Events: []anthropic.BetaManagedAgentsEventParamsUnion{say("!tool bash {\"command\":\"cat f\"}\n!echo")},
	}); err != nil {
		t.Fatal(err)
	}
	untilTurnEnds(t, s)
	results = toolResults(t, w, sess.ID)
	if len(results) != 2 {
		t.Fatalf("tool results after two turns: %v", results)
	}
	second := false
	for _, r := range results {
		second = second || (len(r) == 1 && strings.TrimSpace(r[0]) == "hi")
	}
	if !second {
		t.Fatalf("the second turn's cat f: %v", results)
	}
}

// A worker killed mid-call (before it answers) loses the session when its
// lease runs out; a second worker takes it and the call gets exactly one
// result, the second worker's.
func TestSelfHostedWorkerTakeover(t *testing.T) {
	w := setupWorker(t, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fifos := t.TempDir()
	ready, goFifo := filepath.Join(fifos, "ready"), filepath.Join(fifos, "go")
	for _, p := range []string{ready, goFifo} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Says it started (the test reads ready), then waits for the test to
	// write go.
	cmd, _ := json.Marshal(map[string]string{"command": "pwd; echo up > " + ready + "; read x < " + goFifo + "; echo got $x"})

	dir1 := t.TempDir()
	first := startWorker(t, w, "worker-1", dir1)
	sess, err := w.client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(w.agent)}, EnvironmentID: w.envID,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := w.client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	if _, err := w.client.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{
		Events: []anthropic.BetaManagedAgentsEventParamsUnion{say("!tool bash " + string(cmd) + "\n!echo")},
	}); err != nil {
		t.Fatal(err)
	}
	readFifo(t, ready) // the first worker runs the call
	first.cut.cut.Store(true)
	first.stop(t)

	dir2 := t.TempDir()
	startWorker(t, w, "worker-2", dir2)
	readFifo(t, ready) // the second took the session after the lease ran out
	writeFifo(t, goFifo, "go\n")
	untilTurnEnds(t, s)

	results := toolResults(t, w, sess.ID)
	if len(results) != 1 {
		t.Fatalf("tool results: %v, want one call answered", results)
	}
	for _, r := range results {
		if len(r) != 1 || !strings.Contains(r[0], dir2) || !strings.Contains(r[0], "got go") || strings.Contains(r[0], dir1) {
			t.Fatalf("tool result %q: want exactly one, from the second worker (%s)", r, dir2)
		}
	}
}

// readFifo reads the fifo at p until its writer closes it, within a
// minute.
func readFifo(t *testing.T, p string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		f, err := os.Open(p)
		if err == nil {
			_, err = io.ReadAll(f)
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("nothing wrote %s within a minute", p)
	}
}

// writeFifo writes s to the fifo at p once a reader opens it, within a
// minute.
func writeFifo(t *testing.T, p, s string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(p, []byte(s), 0o600) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("nothing read %s within a minute", p)
	}
}

// environmentKey issues an environment key for envID through the admin
// API (its REST gateway), as the tenant's admin.
func environmentKey(t *testing.T, srv *server.Server, tenantKey string, envID string) string {
	t.Helper()
	var out struct {
		APIKey struct {
			ID            string `json:"id"`
			EnvironmentID string `json:"environment_id"`
		} `json:"api_key"`
		Secret string `json:"secret"`
	}
	adminCall(t, srv, tenantKey, "/admin/v1/tenants/"+string(tenant.Default)+"/environments/"+envID+"/keys", `{"name":"worker"}`, &out)
	if out.Secret == "" || out.APIKey.EnvironmentID != envID {
		t.Fatalf("environment key: %+v", out)
	}
	return out.Secret
}

// adminCall POSTs body to the admin gateway's path with key and decodes
// the answer into out.
func adminCall(t *testing.T, srv *server.Server, key, path, body string, out any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+srv.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("POST %s: %v: %s", path, err, b)
	}
}

// An environment key, through corral's real authentication: it polls its
// environment's queue and nothing else, another tenant's environment is not
// found, and once revoked it is refused.
func TestEnvironmentKeyScope(t *testing.T) {
	w := setupWorker(t, 120*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	asKey := anthropic.NewClient(
		option.WithBaseURL("http://"+w.srv.HTTPAddr()),
		option.WithAuthToken(w.key),
		option.WithMaxRetries(0),
	)
	if _, err := asKey.Beta.Environments.Work.Poll(ctx, w.envID, anthropic.BetaEnvironmentWorkPollParams{}); err != nil {
		t.Fatalf("poll with the environment key: %v", err)
	}
	_, err := asKey.Beta.Agents.List(ctx, anthropic.BetaAgentListParams{})
	apiError(t, err, http.StatusForbidden)
	_, err = asKey.Beta.Environments.Get(ctx, w.envID, anthropic.BetaEnvironmentGetParams{})
	apiError(t, err, http.StatusForbidden)
	// The tenant's own key may read the queue too.
	if _, err := w.client.Beta.Environments.Work.Stats(ctx, w.envID, anthropic.BetaEnvironmentWorkStatsParams{}); err != nil {
		t.Fatalf("stats with the tenant's key: %v", err)
	}

	// Another tenant's self-hosted environment: not found for this key.
	otherKey := servertest.TenantKey(t, w.srv, "tenant_other")
	other := anthropic.NewClient(option.WithBaseURL("http://"+w.srv.HTTPAddr()), option.WithAPIKey(otherKey), option.WithMaxRetries(0))
	env, err := other.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{
		Name: "theirs", Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfSelfHosted: &anthropic.BetaSelfHostedConfigParams{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = asKey.Beta.Environments.Work.Poll(ctx, env.ID, anthropic.BetaEnvironmentWorkPollParams{})
	apiError(t, err, http.StatusNotFound)

	// Revoked through the admin API: refused at once.
	keys := struct {
		APIKeys []struct {
			ID            string `json:"id"`
			EnvironmentID string `json:"environment_id"`
		} `json:"api_keys"`
	}{}
	adminGet(t, w.srv, servertest.TenantKey(t, w.srv, tenant.Default), "/admin/v1/tenants/"+string(tenant.Default)+"/api_keys", &keys)
	var keyID string
	for _, k := range keys.APIKeys {
		if k.EnvironmentID == w.envID {
			keyID = k.ID
		}
	}
	if keyID == "" {
		t.Fatalf("the key list has no key of %s: %+v", w.envID, keys)
	}
	var revoked map[string]any
	adminCall(t, w.srv, servertest.TenantKey(t, w.srv, tenant.Default), "/admin/v1/tenants/"+string(tenant.Default)+"/api_keys/"+keyID+"/revoke", `{}`, &revoked)
	_, err = asKey.Beta.Environments.Work.Poll(ctx, w.envID, anthropic.BetaEnvironmentWorkPollParams{})
	apiError(t, err, http.StatusUnauthorized)
}

// adminGet GETs the admin gateway's path with key into out.
func adminGet(t *testing.T, srv *server.Server, key, path string, out any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+srv.HTTPAddr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, b)
	}
}
