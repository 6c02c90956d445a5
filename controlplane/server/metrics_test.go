package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/metrics/metricstest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// A session with a tool call, run through the public API against a node
// with metrics on, moves the node's counters: its requests are counted
// by route pattern (never the path with its ids), the tool call by tool
// and outcome, the model call by model, its tokens by tenant; an open
// event stream shows in the gauge until it ends.
func TestNodeMetricsAfterASession(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", MetricsAddr: "127.0.0.1:0"})
	if !strings.HasPrefix(srv.MetricsURL(), "http://127.0.0.1:") {
		t.Fatalf("MetricsURL %q", srv.MetricsURL())
	}
	startHost(t, srv, "h1")
	s := newToolSession(t, srv)

	// An event stream, open while the turn runs.
	ctx, closeStream := context.WithCancel(context.Background())
	defer closeStream()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/v1/sessions/"+s.id+"/events/stream", nil)
	resp, err := s.c.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("opening the stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	// The gauge moves before the stream's headers are sent.
	if v, _ := metricstest.Get(t, srv.MetricsURL()).Value("corral_sse_streams", nil); v != 1 {
		t.Errorf("corral_sse_streams with a stream open = %v, want 1", v)
	}

	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo metered"}`)); !strings.Contains(out, "metered") {
		t.Fatalf("tool result %q", out)
	}
	closeStream()
	waitfor.Cond(t, 30*time.Second, "the stream's end to show in corral_sse_streams", func() bool {
		v, _ := metricstest.Get(t, srv.MetricsURL()).Value("corral_sse_streams", nil)
		return v == 0
	})

	m := metricstest.Get(t, srv.MetricsURL())
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"corral_http_requests_total", map[string]string{"route": "POST /v1/sessions", "code": "200"}},
		{"corral_http_requests_total", map[string]string{"route": "POST /v1/sessions/{session_id}/events", "code": "200"}},
		{"corral_http_requests_total", map[string]string{"route": "GET /v1/sessions/{session_id}/events", "code": "200"}},
		{"corral_http_requests_total", map[string]string{"route": "GET /v1/sessions/{session_id}/events/stream", "code": "200"}},
		{"corral_http_request_duration_seconds", map[string]string{"route": "POST /v1/agents"}},
		{"corral_tool_calls_total", map[string]string{"tool": "bash", "outcome": "ok"}},
		{"corral_tool_call_duration_seconds", map[string]string{"tool": "bash", "outcome": "ok"}},
		{"corral_model_request_duration_seconds", map[string]string{"model": "fake", "outcome": "ok"}},
		{"corral_model_tokens_total", map[string]string{"tenant": string(tenant.Default), "model": "fake", "direction": "input"}},
		{"corral_loop_step_duration_seconds", map[string]string{"action": "call_model"}},
		{"corral_loop_step_duration_seconds", map[string]string{"action": "run_tools"}},
		{"corral_placements_total", map[string]string{"outcome": "placed"}},
		{"corral_placement_duration_seconds", map[string]string{"outcome": "placed"}},
		{"corral_raft_apply_duration_seconds", map[string]string{"command": "place", "outcome": "ok"}},
		{"corral_raft_leader", nil},
		// The one-node cluster's election, seen by the observer the node
		// registers right after starting Raft, a heartbeat timeout before
		// any election can start.
		{"corral_raft_leader_changes_total", nil},
	} {
		if v, _ := m.Value(c.name, c.labels); v < 1 {
			t.Errorf("%s%v = %v, want at least 1", c.name, c.labels, v)
		}
	}
	// The model ran twice: the tool call, then the answer after its result.
	if v, _ := m.Value("corral_model_request_duration_seconds", map[string]string{"model": "fake"}); v < 2 {
		t.Errorf("model requests = %v, want at least 2", v)
	}
	for _, route := range m.LabelValues("corral_http_requests_total", "route") {
		if strings.Contains(route, s.id) || strings.Contains(route, "sesn_") {
			t.Errorf("a route label carries an id: %q", route)
		}
	}
	// A request no route serves is counted under the catch-all pattern.
	if r, _ := get(t, s.base+"/no/such/route"); r.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /no/such/route: %d", r.StatusCode)
	}
	if v, _ := metricstest.Get(t, srv.MetricsURL()).Value("corral_http_requests_total", map[string]string{"route": "/", "code": "404"}); v != 1 {
		t.Errorf("unrouted requests = %v, want 1", v)
	}
	// An admin call over gRPC without a key: counted by method and code.
	if _, err := grpcClient(t, srv.GRPCAddr()).GetStatus(context.Background(), &adminv1.GetStatusRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("GetStatus without a key: %v", err)
	}
	if v, _ := metricstest.Get(t, srv.MetricsURL()).Value("corral_grpc_requests_total", map[string]string{
		"method": "/corral.admin.v1.ClusterService/GetStatus", "code": "Unauthenticated"}); v != 1 {
		t.Errorf("corral_grpc_requests_total{GetStatus, Unauthenticated} = %v, want 1", v)
	}
	if _, ok := m.Value("go_goroutines", nil); !ok {
		t.Error("no go_goroutines: the Go collector is missing")
	}
}

// Metrics name tenants: a metrics address beyond loopback is refused in
// plaintext unless --insecure-listen, like the API's listeners.
func TestMetricsListenerBeyondLoopbackNeedsInsecure(t *testing.T) {
	cfg := server.Config{DatabaseURL: "postgres://unused", DataDir: t.TempDir(), MetricsAddr: "0.0.0.0:0"}
	err := cfg.Validate()
	if errdefs.KindOf(err) != errdefs.InvalidArgumentKind || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("Validate with a plaintext metrics address beyond loopback: %v, want an invalid argument naming --metrics-addr", err)
	}
	cfg.MetricsAddr = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("loopback metrics address: %v", err)
	}
	cfg.MetricsAddr, cfg.InsecureListen = "0.0.0.0:0", true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("with --insecure-listen: %v", err)
	}
}
