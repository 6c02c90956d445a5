package server_test

import (
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/tracing"
	"corral.dev/corral/internal/tracing/tracingtest"
)

// One turn whose model calls bash is one trace across both daemons, sent
// to a real OTLP receiver: the events POST is its root, the loop's steps
// its children, the tool call a step's child, and the host protocol
// carries the trace to the host agent, whose Exec span is the child of the
// node's call. No span carries what the tenant sent or got.
func TestTraceOfATurn(t *testing.T) {
	rcv := tracingtest.NewReceiver(t)
	otlp := tracing.Config{Endpoint: rcv.Addr(), Insecure: true, BatchTimeout: 50 * time.Millisecond}
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", Tracing: otlp})
	startHostWith(t, srv, "h1", func(c *agent.Config) { c.Tracing = otlp })
	s := newToolSession(t, srv)

	const command = `!tool bash {"command":"echo hi"}`
	if out := toolOutput(t, s.turn(command)); !strings.Contains(out, "hi") {
		t.Fatalf("tool result %q", out)
	}

	// Spans arrive in batches from both daemons, in no set order: collect
	// until the host's Exec span and every ancestor up to its root are in.
	const execMethod = "corral.hostagent.v1.SandboxService/Exec"
	byID := map[string]tracingtest.Span{}
	var hostExec tracingtest.Span
	chain := func() []tracingtest.Span {
		if hostExec.SpanID == "" {
			return nil
		}
		out := []tracingtest.Span{hostExec}
		for len(out) < 20 {
			p := out[len(out)-1].ParentID
			if p == "" {
				return out
			}
			parent, ok := byID[p]
			if !ok {
				return nil
			}
			out = append(out, parent)
		}
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	var path []tracingtest.Span
	for n := 0; path == nil && n < 1000; n++ {
		sp, ok := rcv.Next(time.Until(deadline))
		if !ok {
			t.Fatalf("no complete trace from the host's exec to its root within 30s; got %d spans: %v", len(byID), byID)
		}
		byID[sp.SpanID] = sp
		if sp.Service == "corral-host" && sp.Name == execMethod && sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
			hostExec = sp
		}
		path = chain()
	}
	if path == nil {
		t.Fatalf("no complete trace among %d spans", len(byID))
	}

	// Root first.
	want := []struct {
		service, name string
		kind          tracepb.Span_SpanKind
	}{
		{"corral-server", "POST /v1/sessions/{session_id}/events", tracepb.Span_SPAN_KIND_SERVER},
		{"corral-server", "agentloop run_tools", tracepb.Span_SPAN_KIND_INTERNAL},
		{"corral-server", "execute_tool bash", tracepb.Span_SPAN_KIND_INTERNAL},
		{"corral-server", execMethod, tracepb.Span_SPAN_KIND_CLIENT},
		{"corral-host", execMethod, tracepb.Span_SPAN_KIND_SERVER},
	}
	if len(path) != len(want) {
		t.Fatalf("the exec's path to its root has %d spans, want %d:\n%v", len(path), len(want), path)
	}
	for i, w := range want {
		got := path[len(path)-1-i]
		if got.Service != w.service || got.Name != w.name || got.Kind != w.kind {
			t.Errorf("span %d from the root = %s, want %s %q %s", i, got, w.service, w.name, w.kind)
		}
		if got.TraceID != hostExec.TraceID {
			t.Errorf("span %q in trace %s, the host's exec in %s", got.Name, got.TraceID, hostExec.TraceID)
		}
		if got.Error {
			t.Errorf("span %s has an error status", got)
		}
	}
	root, step, tool, client := path[4], path[3], path[2], path[1]
	for _, c := range []struct {
		span      tracingtest.Span
		key, want string
	}{
		{root, "http.route", "/v1/sessions/{session_id}/events"},
		{root, "http.request.method", "POST"},
		{root, "http.response.status_code", "200"},
		{root, "corral.session_id", s.id},
		{root, "corral.tenant", string(tenant.Default)},
		{step, "corral.loop.action", "run_tools"},
		{step, "corral.session_id", s.id},
		{tool, "gen_ai.tool.name", "bash"},
		{tool, "corral.tool.outcome", "ok"},
		{tool, "corral.session_id", s.id},
		{client, "rpc.system.name", "grpc"},
		{client, "rpc.method", execMethod},
		{client, "rpc.response.status_code", "OK"},
		{hostExec, "rpc.response.status_code", "OK"},
		{hostExec, "corral.session_id", s.id},
	} {
		if got := c.span.Attrs[c.key]; got != c.want {
			t.Errorf("%q %s = %q, want %q", c.span.Name, c.key, got, c.want)
		}
	}
	if root.Instance != "node-a" || hostExec.Instance != "h1" {
		t.Errorf("service.instance.id: node %q, host %q; want node-a, h1", root.Instance, hostExec.Instance)
	}

	// The turn's model calls are in the trace too (the tool call, then
	// the answer), each under a step of its own under the request: the
	// first is the start_turn step's, which calls the model at once.
	// They may still be on their way.
	modelSteps := func() (steps []tracingtest.Span) {
		for _, sp := range byID {
			if sp.TraceID != root.TraceID || sp.Name != "chat fake" {
				continue
			}
			parent, ok := byID[sp.ParentID]
			if !ok {
				return nil
			}
			steps = append(steps, parent)
		}
		return steps
	}
	steps := modelSteps()
	for n := 0; len(steps) < 2 && n < 1000; n++ {
		sp, ok := rcv.Next(time.Until(deadline))
		if !ok {
			t.Fatalf("%d model calls with their steps in the trace within 30s, want 2", len(steps))
		}
		byID[sp.SpanID] = sp
		steps = modelSteps()
	}
	for _, st := range steps {
		if (st.Name != "agentloop call_model" && st.Name != "agentloop start_turn") || st.ParentID != root.SpanID {
			t.Errorf("a model call under %s, want a call_model (or start_turn) step under the request", st)
		}
	}

	// Nothing the tenant sent or got: not the message, the command, its
	// output, or the model's text.
	for _, sp := range byID {
		for k, v := range sp.Attrs {
			for _, bad := range []string{command, "echo", "!tool", "hi\n"} {
				if strings.Contains(v, bad) || strings.Contains(sp.Name, bad) {
					t.Errorf("span %q attribute %s = %q carries tenant content %q", sp.Name, k, v, bad)
				}
			}
		}
	}
}

// Without an endpoint a node starts no exporter.
func TestNoTracesWithoutEndpoint(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	if srv.TraceProvider() != nil {
		t.Fatal("a node without --otlp-endpoint has a tracer provider")
	}
}
