package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// The host protocol carries trace context by hand: W3C traceparent (and
// tracestate) in the call's metadata, read and written by a gRPC stats
// handler that makes one span per call, named by its full method. A stats
// handler, not an interceptor, because it sees a stream's end however the
// caller left it (read to the end, or its context ended), so the span
// ends with the call.

// propagator is W3C Trace Context, the only format either side speaks.
var propagator = propagation.TraceContext{}

// DialOptions are the options that trace a client connection's calls and
// send their trace context; none when p is nil.
func (p *Provider) DialOptions() []grpc.DialOption {
	if p == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(&rpcSpans{tracer: p.Tracer("corral.dev/corral/internal/tracing"), client: true})}
}

// ServerOptions are the options that trace a server's calls, continuing
// the trace context their callers sent; none when p is nil.
func (p *Provider) ServerOptions() []grpc.ServerOption {
	if p == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(&rpcSpans{tracer: p.Tracer("corral.dev/corral/internal/tracing")})}
}

// rpcSpans is a stats handler that makes a span of every call.
type rpcSpans struct {
	tracer trace.Tracer
	client bool
}

var _ stats.Handler = (*rpcSpans)(nil)

func (h *rpcSpans) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	method := strings.TrimPrefix(info.FullMethodName, "/")
	attrs := []attribute.KeyValue{semconv.RPCSystemNameGRPC, semconv.RPCMethod(method)}
	if h.client {
		ctx, _ = h.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		propagator.Inject(ctx, metadataCarrier(md))
		return metadata.NewOutgoingContext(ctx, md)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = propagator.Extract(ctx, metadataCarrier(md))
	ctx, _ = h.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return ctx
}

func (h *rpcSpans) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok {
		return
	}
	span := trace.SpanFromContext(ctx)
	// The status's code only: its message may carry what the sandbox
	// said (a path, a command's error).
	code := status.Code(end.Error)
	span.SetAttributes(semconv.RPCResponseStatusCode(grpcCodeName(code)))
	if end.Error != nil {
		span.SetStatus(codes.Error, code.String())
	}
	span.End(trace.WithTimestamp(end.EndTime))
}

func (h *rpcSpans) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h *rpcSpans) HandleConn(context.Context, stats.ConnStats)                       {}

// grpcCodeNames are gRPC's codes as the conventions spell them.
var grpcCodeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
	"UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func grpcCodeName(c grpccodes.Code) string {
	if int(c) < len(grpcCodeNames) {
		return grpcCodeNames[c]
	}
	return "UNKNOWN"
}

// metadataCarrier lets the propagator read and write gRPC metadata.
type metadataCarrier metadata.MD

var _ propagation.TextMapCarrier = metadataCarrier(nil)

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
