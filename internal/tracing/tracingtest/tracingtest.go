// Package tracingtest is an OTLP/gRPC trace receiver for tests: the
// collector's TraceService on a loopback port, in the test's process, that
// hands every span it is sent to the test.
package tracingtest

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Span is a received span, with its resource's service.
type Span struct {
	Service  string // service.name
	Instance string // service.instance.id
	TraceID  string // hex
	SpanID   string
	ParentID string // "" for a root
	Name     string
	Kind     tracepb.Span_SpanKind
	Attrs    map[string]string // values as text
	Links    []string          // the linked spans' trace ids
	Error    bool              // status code error
}

// String is the span in one line, for failure messages.
func (s Span) String() string {
	return fmt.Sprintf("%s %q %s span %s parent %q trace %s %v", s.Service, s.Name, s.Kind, s.SpanID, s.ParentID, s.TraceID, s.Attrs)
}

// Receiver is a running trace receiver.
type Receiver struct {
	addr  string
	spans chan Span
}

// maxQueued bounds the spans waiting for the test: an exporter that sends
// more blocks, as a slow collector would make it.
const maxQueued = 10_000

// NewReceiver starts a plaintext receiver on a loopback port; it stops when
// the test ends.
func NewReceiver(t testing.TB) *Receiver {
	t.Helper()
	return start(t)
}

// NewTLSReceiver is NewReceiver serving TLS with cert.
func NewTLSReceiver(t testing.TB, cert tls.Certificate) *Receiver {
	t.Helper()
	return start(t, grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
}

func start(t testing.TB, opts ...grpc.ServerOption) *Receiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{addr: ln.Addr().String(), spans: make(chan Span, maxQueued)}
	srv := grpc.NewServer(opts...)
	collectorpb.RegisterTraceServiceServer(srv, &service{r: r})
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return r
}

// Addr is the receiver's host:port, an --otlp-endpoint.
func (r *Receiver) Addr() string { return r.addr }

// Queued is how many received spans wait for Next.
func (r *Receiver) Queued() int { return len(r.spans) }

// Next returns the next span received, or false once d has passed
// without one.
func (r *Receiver) Next(d time.Duration) (Span, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case s := <-r.spans:
		return s, true
	case <-t.C:
		return Span{}, false
	}
}

type service struct {
	collectorpb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s *service) Export(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				span := Span{
					Service:  res["service.name"],
					Instance: res["service.instance.id"],
					TraceID:  hex.EncodeToString(sp.GetTraceId()),
					SpanID:   hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()),
					Name:     sp.GetName(),
					Kind:     sp.GetKind(),
					Attrs:    attrs(sp.GetAttributes()),
					Error:    sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				}
				for _, l := range sp.GetLinks() {
					span.Links = append(span.Links, hex.EncodeToString(l.GetTraceId()))
				}
				select {
				case s.r.spans <- span:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// attrs are key-values as text.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}
