// Package tracing is what both daemons share for OpenTelemetry traces: the
// tracer provider that exports spans over OTLP/gRPC, started only when an
// endpoint is configured, and the host protocol's propagation of trace
// context (grpc.go).
//
// Off (no endpoint) there is no provider, no exporter and no goroutine:
// Start returns nil, a nil *Provider's Tracer is nil, and every place that
// makes spans checks for that (or for a recording span) before it builds
// anything, so the hot paths cost nothing extra.
//
// A turn's trace, across both daemons:
//
//	POST /v1/sessions/{session_id}/events     (server span, control plane)
//	 └─ agentloop call_model / run_tools ...  (the loop's steps, started by the wake)
//	     ├─ chat {model}                      (model call)
//	     └─ execute_tool bash                 (tool call)
//	         └─ corral.hostagent.v1.SandboxService/Exec   (client span)
//	             └─ corral.hostagent.v1.SandboxService/Exec   (server span, host agent)
//
// Spans carry ids (session, tenant, tool call), names (route, tool, model)
// and outcomes, never what a tenant sent or got: no messages, commands,
// outputs, paths, secrets or error texts.
package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/metrics"
)

// Attribute keys of corral's own (OpenTelemetry's conventions have none
// for these).
const (
	SessionIDKey = attribute.Key("corral.session_id")
	TenantKey    = attribute.Key("corral.tenant")
)

// Config configures a daemon's traces. The zero value is off.
type Config struct {
	// Endpoint is host:port of an OTLP/gRPC collector. Empty: tracing is
	// off.
	Endpoint string
	// Insecure sends spans in plaintext; only to a loopback endpoint.
	// Otherwise the exporter speaks TLS, verified against the system's
	// roots or CAFile.
	Insecure bool
	// CAFile is a PEM file of the CA that signed the collector's
	// certificate, in place of the system's roots.
	CAFile string
	// SampleRatio is the fraction of new traces sampled, in [0, 1]; a span
	// whose parent was sampled (or not) follows its parent. Zero means 1:
	// every trace (to sample none, leave tracing off).
	SampleRatio float64
	// ServiceName, NodeID and Version are the resource's service.name,
	// service.instance.id and service.version.
	ServiceName, NodeID, Version string
	// BatchTimeout is the longest a span waits to be exported. Default 5s.
	BatchTimeout time.Duration
	// Logger receives the exporter's errors (a collector down, refused).
	// OpenTelemetry has one error handler per process: with several
	// daemons in one (tests, corral dev) the last one started logs them.
	// Default: discarded.
	Logger *slog.Logger
}

// Enabled reports whether c turns tracing on.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Validate checks c; errors name the flags.
func (c Config) Validate() error {
	if !c.Enabled() {
		if c.Insecure || c.CAFile != "" {
			return errdefs.InvalidArgument("--otlp-insecure and --otlp-ca need --otlp-endpoint")
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(c.Endpoint); err != nil {
		return errdefs.InvalidArgument("--otlp-endpoint %q: want host:port", c.Endpoint)
	}
	if c.Insecure && c.CAFile != "" {
		return errdefs.InvalidArgument("--otlp-insecure and --otlp-ca exclude each other")
	}
	if c.Insecure && !metrics.IsLoopback(c.Endpoint) {
		return errdefs.InvalidArgument("--otlp-insecure sends spans in plaintext: only to a loopback --otlp-endpoint (%s is not); give the collector's CA with --otlp-ca", c.Endpoint)
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		return errdefs.InvalidArgument("--otlp-sample-ratio %v: want a fraction in (0, 1]", c.SampleRatio)
	}
	return nil
}

// Provider is a running tracer provider and its exporter. A nil *Provider
// is tracing off.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Start starts the exporter and the tracer provider c describes, or returns
// nil when c is off. The exporter connects lazily: a collector that is down
// costs dropped spans, never a failed start.
func Start(ctx context.Context, c Config) (*Provider, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.Endpoint)}
	if c.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("reading --otlp-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, errdefs.InvalidArgument("--otlp-ca %s holds no PEM certificate", c.CAFile)
			}
		}
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tc)))
	}
	if c.Logger != nil {
		log := c.Logger
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("exporting traces", "endpoint", c.Endpoint, "err", err) }))
	} else {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("starting the OTLP exporter: %w", err)
	}
	ratio := c.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(c.ServiceName),
		semconv.ServiceInstanceID(c.NodeID),
		semconv.ServiceVersion(c.Version),
	)
	batch := []sdktrace.BatchSpanProcessorOption{}
	if c.BatchTimeout > 0 {
		batch = append(batch, sdktrace.WithBatchTimeout(c.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, batch...),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	return &Provider{tp: tp}, nil
}

// Tracer returns the named tracer (the instrumented package's import
// path), or nil when p is nil.
func (p *Provider) Tracer(name string) trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer(name)
}

// Shutdown exports the spans still queued and stops the exporter, within
// ctx. Safe on a nil *Provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	err := p.tp.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("exporting the last spans: %w", err)
	}
	return err
}

// Recording returns ctx's span when it records, else nil: callers build
// attributes only after it says yes, so that off (or unsampled) a span's
// annotation costs a nil check and allocates nothing.
func Recording(ctx context.Context) trace.Span {
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		return s
	}
	return nil
}

// Detach returns a context that carries only ctx's span context (none of
// its values, deadline or cancellation): work that outlives a request
// continues its trace with it. Without a valid span context it is
// context.Background(), and allocates nothing.
func Detach(ctx context.Context) context.Context {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithSpanContext(context.Background(), sc)
}
