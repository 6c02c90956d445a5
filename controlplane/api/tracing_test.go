package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"corral.dev/corral/internal/logging"
)

// routed is a handler behind withRequestContext as the node builds it: a
// mux recording its route pattern.
func routed(tracer trace.Tracer, h http.HandlerFunc) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/things/{thing_id}", h)
	return withRequestContext(logging.Discard(), nil, tracer, RecordRoute(mux))
}

// A request's span is named by its route, never its path; a client's
// traceparent does not make it a child of the client's trace (tenants
// choose neither our traces nor their sampling) but a link of a new root;
// a 5xx is an error, a panic's included.
func TestRequestSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	var inner trace.SpanContext
	h := routed(tracer, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("panic") != "" {
			panic("boom")
		}
		inner = trace.SpanContextFromContext(r.Context())
	})
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	req := httptest.NewRequest("POST", "/v1/things/thing_123", nil)
	req.Header.Set("traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/things/thing_456?panic=1", nil))

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2", len(spans))
	}
	first, panicked := spans[0], spans[1]
	if first.Name() != "POST /v1/things/{thing_id}" {
		t.Errorf("span name %q, want the route's", first.Name())
	}
	if first.Parent().IsValid() || first.SpanContext().TraceID().String() == clientTrace {
		t.Errorf("the request's span continues the client's trace (parent %v)", first.Parent())
	}
	if links := first.Links(); len(links) != 1 || links[0].SpanContext.TraceID().String() != clientTrace {
		t.Errorf("links %v, want the client's trace", links)
	}
	if inner.SpanID() != first.SpanContext().SpanID() {
		t.Error("the handler's context does not carry the request's span")
	}
	attrs := map[string]string{}
	for _, kv := range first.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	for k, want := range map[string]string{"http.route": "/v1/things/{thing_id}", "http.request.method": "POST", "http.response.status_code": "200"} {
		if attrs[k] != want {
			t.Errorf("%s = %q, want %q", k, attrs[k], want)
		}
	}
	if first.Status().Code == codes.Error {
		t.Error("a 200 is an error")
	}
	if panicked.Status().Code != codes.Error {
		t.Errorf("a panic's 500: status %v, want an error", panicked.Status())
	}
}

// Off (no tracer), a request costs what it did before tracing existed.
// BenchmarkRequest's figures with and without a tracer are in the README.
func BenchmarkRequest(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tracer trace.Tracer
	}{
		{"off", nil},
		{"on", sdktrace.NewTracerProvider().Tracer("test")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := routed(bc.tracer, func(http.ResponseWriter, *http.Request) {})
			req := httptest.NewRequest("POST", "/v1/things/thing_123", nil).WithContext(context.Background())
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(httptest.NewRecorder(), req)
			}
		})
	}
}
