package tracing

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"corral.dev/corral/internal/errdefs"
)

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string // "" for valid
	}{
		{Config{}, ""},
		{Config{Endpoint: "127.0.0.1:4317", Insecure: true}, ""},
		{Config{Endpoint: "localhost:4317", Insecure: true}, ""},
		{Config{Endpoint: "collector.example:4317"}, ""},
		{Config{Endpoint: "collector.example:4317", CAFile: "ca.pem", SampleRatio: 0.25}, ""},
		{Config{Insecure: true}, "need --otlp-endpoint"},
		{Config{CAFile: "ca.pem"}, "need --otlp-endpoint"},
		{Config{Endpoint: "collector.example"}, "want host:port"},
		{Config{Endpoint: "collector.example:4317", Insecure: true}, "only to a loopback"},
		{Config{Endpoint: "10.0.0.1:4317", Insecure: true}, "only to a loopback"},
		{Config{Endpoint: "127.0.0.1:4317", Insecure: true, CAFile: "ca.pem"}, "exclude each other"},
		{Config{Endpoint: "127.0.0.1:4317", SampleRatio: 1.5}, "(0, 1]"},
		{Config{Endpoint: "127.0.0.1:4317", SampleRatio: -0.1}, "(0, 1]"},
	} {
		err := tt.cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.cfg, err)
		case tt.want != "" && (errdefs.KindOf(err) != errdefs.InvalidArgumentKind || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: %v, want an invalid argument saying %q", tt.cfg, err, tt.want)
		}
	}
}

// Off, Start starts nothing (no exporter, no provider) and every hook is
// empty.
func TestOffStartsNothing(t *testing.T) {
	p, err := Start(context.Background(), Config{})
	if err != nil || p != nil {
		t.Fatalf("Start without an endpoint = %v, %v; want nil, nil", p, err)
	}
	if p.Tracer("x") != nil || p.DialOptions() != nil || p.ServerOptions() != nil || p.Shutdown(context.Background()) != nil {
		t.Fatal("a nil provider's tracer, options or shutdown are not empty")
	}
}

// The hooks the hot paths call allocate nothing when no span records.
func TestOffAllocatesNothing(t *testing.T) {
	bg := context.Background()
	unsampled := trace.ContextWithSpanContext(bg, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}}))
	if n := testing.AllocsPerRun(100, func() {
		if Recording(bg) != nil || Recording(unsampled) != nil {
			t.Fatal("a span records")
		}
		_ = Detach(bg)
	}); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}

// A call through the host protocol's stats handlers is a client span and,
// in the server, its child: the trace context crossed in the metadata.
func TestGRPCPropagation(t *testing.T) {
	ended := endedSpans(make(chan sdktrace.ReadOnlySpan, 3))
	p := &Provider{tp: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(ended))}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(p.ServerOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), append(p.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	ctx, parent := p.Tracer("test").Start(context.Background(), "caller")
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	// The server's span may end after the client has its answer.
	spans := map[trace.SpanKind]sdktrace.ReadOnlySpan{}
	timeout := time.After(10 * time.Second)
	for len(spans) < 3 {
		select {
		case s := <-ended:
			spans[s.SpanKind()] = s
		case <-timeout:
			t.Fatalf("%d spans ended within 10s, want 3 (caller, client, server): %v", len(spans), spans)
		}
	}
	client, server := spans[trace.SpanKindClient], spans[trace.SpanKindServer]
	if client == nil || server == nil {
		t.Fatalf("spans %v, want a client and a server span", spans)
	}
	const method = "grpc.health.v1.Health/Check"
	if client.Name() != method || server.Name() != method {
		t.Errorf("names %q, %q; want %q", client.Name(), server.Name(), method)
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the client span is not the caller's child")
	}
	if server.Parent().SpanID() != client.SpanContext().SpanID() || server.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Error("the server span is not the client span's child in the caller's trace")
	}
	for _, s := range []sdktrace.ReadOnlySpan{client, server} {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if attrs["rpc.system.name"] != "grpc" || attrs["rpc.method"] != method || attrs["rpc.response.status_code"] != "OK" {
			t.Errorf("%v span attributes %v", s.SpanKind(), attrs)
		}
	}
}

// endedSpans hands each span that ends to the test.
type endedSpans chan sdktrace.ReadOnlySpan

func (e endedSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e endedSpans) OnEnd(s sdktrace.ReadOnlySpan)                   { e <- s }
func (e endedSpans) Shutdown(context.Context) error                  { return nil }
func (e endedSpans) ForceFlush(context.Context) error                { return nil }
