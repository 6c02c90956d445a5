package agentloop_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tenant"
)

// endedSpans hands each span that ends to the test.
type endedSpans chan sdktrace.ReadOnlySpan

func (e endedSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e endedSpans) OnEnd(s sdktrace.ReadOnlySpan)                   { e <- s }
func (e endedSpans) Shutdown(context.Context) error                  { return nil }
func (e endedSpans) ForceFlush(context.Context) error                { return nil }

// A wake's steps are spans under the span that sent the input, named by
// their action; the wait that ends the Run makes none.
func TestStepSpansContinueTheWake(t *testing.T) {
	ended := endedSpans(make(chan sdktrace.ReadOnlySpan, 100))
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(ended)).Tracer("test")
	ms := looptest.NewMemStore()
	h := memHarness{ms}
	id := h.CreateSession(t, agentloop.Agent{})
	r := &agentloop.Loop{Store: ms, Model: model.Fake{}, Tools: agentloop.NoSandbox{}, NewID: looptest.NewID, Tracer: tracer}
	pool := agentloop.NewPool(r, func(c context.Context, _ string) (context.Context, func(), bool, error) {
		return c, func() {}, true, nil
	}, nil)
	defer pool.Stop()

	reqCtx, req := tracer.Start(context.Background(), "request")
	h.Send(t, id, map[string]any{"type": "user.message", "content": []map[string]string{{"type": "text", "text": "hello"}}})
	pool.WakeFrom(reqCtx, tenant.Default, id)
	req.End()

	var steps []sdktrace.ReadOnlySpan
	timeout := time.After(30 * time.Second)
	for len(steps) == 0 || steps[len(steps)-1].Name() != "agentloop end_turn" {
		select {
		case s := <-ended:
			if s.Name() != "request" {
				steps = append(steps, s)
			}
		case <-timeout:
			t.Fatalf("no end_turn step within 30s; steps so far: %v", steps)
		}
		if len(steps) > 10 {
			t.Fatalf("%d steps, want a few", len(steps))
		}
	}
	for _, s := range steps {
		if s.Parent().SpanID() != req.SpanContext().SpanID() || s.SpanContext().TraceID() != req.SpanContext().TraceID() {
			t.Errorf("step %q is not the request span's child", s.Name())
		}
		if s.SpanKind() != trace.SpanKindInternal || s.Name() == "agentloop wait" {
			t.Errorf("step span %q of kind %v", s.Name(), s.SpanKind())
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if attrs["corral.session_id"] != id || attrs["corral.tenant"] != string(tenant.Default) || "agentloop "+attrs["corral.loop.action"] != s.Name() {
			t.Errorf("step %q attributes %v", s.Name(), attrs)
		}
	}
}
