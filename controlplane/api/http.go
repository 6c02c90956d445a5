package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"corral.dev/corral/controlplane/api/console"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/errdefs/errhttp"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// HandlerOptions configure the HTTP handler.
type HandlerOptions struct {
	// Gateway serves /admin/ (see NewGateway).
	Gateway http.Handler
	// PublicAPI, when set, serves /v1/: the Managed Agents REST API
	// (package publicapi).
	PublicAPI http.Handler
	// PublicAPIBodyLimit is the largest request body /v1/ takes
	// (publicapi.MaxBodyBytes); zero means MaxMessageBytes.
	PublicAPIBodyLimit int64
	// FileUploadBodyLimit is the largest body a file upload (POST
	// /v1/files) takes: the file limit plus the multipart framing
	// (publicapi.FileUploadOverhead); zero means PublicAPIBodyLimit.
	FileUploadBodyLimit int64
	// Authn, when set, lets the web console sign users in with its issuers
	// that have a console client, and checks the tokens it gets.
	Authn *auth.Authenticator
	// Ready reports whether the node can serve traffic (database reachable).
	Ready func(ctx context.Context) error
	// Observe, when set, receives every request once it is served, by
	// route pattern (see RecordRoute; wrap PublicAPI's mux in it too).
	Observe ObserveFunc
	// Tracer, when set, makes a server span of every request, named by
	// its method and route pattern. A client's traceparent is not
	// followed (a tenant does not choose our traces or their sampling):
	// it becomes a link of the new trace's root. Nil: no spans.
	Tracer trace.Tracer
	Logger *slog.Logger
}

// NewHandler returns the node's HTTP handler.
func NewHandler(opts HandlerOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := opts.Ready(ctx); err != nil {
			WriteError(w, r, errdefs.Wrap(errdefs.UnavailableKind, err, "not ready"))
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/admin/", opts.Gateway)
	if opts.PublicAPI != nil {
		mux.Handle("/v1/", opts.PublicAPI)
	}
	// The web console: static files, and the sign-in with OpenID
	// Providers; the page calls /v1/ and /admin/ with the credential its
	// user signs in with.
	consoleOpts := console.Options{WriteError: WriteError, Logger: opts.Logger}
	if opts.Authn != nil {
		consoleOpts.SignIn = consoleSignIn{opts.Authn}
	}
	consoleHandler := console.Handler(consoleOpts)
	mux.Handle("/console/", consoleHandler)
	mux.Handle("GET /console", consoleHandler)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, r, errdefs.NotFound("no route for %s %s", r.Method, r.URL.Path))
	})
	if opts.PublicAPIBodyLimit == 0 {
		opts.PublicAPIBodyLimit = MaxMessageBytes
	}
	if opts.FileUploadBodyLimit == 0 {
		opts.FileUploadBodyLimit = opts.PublicAPIBodyLimit
	}
	return withRequestContext(opts.Logger, opts.Observe, opts.Tracer, limitBody(opts.PublicAPIBodyLimit, opts.FileUploadBodyLimit, RecordRoute(mux)))
}

// withRequestContext assigns the request id, recovers panics, logs each
// request, hands it to observe (when set) and traces it (with a tracer).
func withRequestContext(log *slog.Logger, observe ObserveFunc, tracer trace.Tracer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := newRequestID()
		w.Header().Set(RequestIDHeader, id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
		r, note := withRouteNote(r)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		if tracer != nil {
			var span trace.Span
			r, span = startRequestSpan(tracer, r, start)
			// Deferred first, so it ends last: after the recovery below
			// wrote a panic's status.
			defer func() { endRequestSpan(span, r.Method, note.pattern, rec.status) }()
		}
		if observe != nil {
			// Deferred before the recovery below, so it runs after it and
			// sees the status a panic was answered with.
			defer func() { observe(note.pattern, rec.status, time.Since(start)) }()
		}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.Error("panic in http handler", "path", r.URL.Path, "request_id", id, "panic", p, "stack", string(debug.Stack()))
				if !rec.wrote {
					WriteError(rec, r, errors.New("internal error"))
				}
			}
			log.Debug("http request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "request_id", id, "duration", time.Since(start))
		}()
		next.ServeHTTP(rec, r)
	})
}

// startRequestSpan starts r's server span, as a new trace whose root links
// to the client's trace context, if it sent one.
func startRequestSpan(tracer trace.Tracer, r *http.Request, start time.Time) (*http.Request, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot(), trace.WithTimestamp(start),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method))}
	// The propagator reads only traceparent and tracestate, each
	// parsed to its fixed form and bounded (the server bounds headers).
	if sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(r.Header))); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, span := tracer.Start(r.Context(), r.Method, opts...)
	return r.WithContext(ctx), span
}

// endRequestSpan names a request's span by its route pattern (never its
// path, which holds ids) and ends it; a 5xx is an error.
func endRequestSpan(span trace.Span, method, pattern string, status int) {
	if pattern != "" {
		// http.route is the path template: the public API's patterns
		// name their method first.
		route := pattern
		if _, path, ok := strings.Cut(pattern, " "); ok {
			route = path
		}
		span.SetName(method + " " + route)
		span.SetAttributes(semconv.HTTPRoute(route))
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 {
		span.SetStatus(otelcodes.Error, "")
	}
	span.End()
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Flush lets streaming handlers (SSE) flush through the recorder.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// ErrorBody is the error envelope every HTTP error uses, the Managed Agents
// API's: {"type":"error","error":{"type":...,"message":...},"request_id":...}.
type ErrorBody struct {
	Type      string      `json:"type"`
	Error     ErrorDetail `json:"error"`
	RequestID string      `json:"request_id"`
}

// ErrorDetail is the inner object of ErrorBody.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// WriteError writes err as the error envelope with the status errhttp maps its
// kind to. Unclassified errors are reported as internal without their text.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	code := errhttp.Status(err)
	msg := err.Error()
	if errdefs.KindOf(err) == errdefs.Unknown {
		msg = "internal error"
	}
	id := RequestID(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if code == http.StatusConflict {
		// The SDKs retry 409s unless told not to; none of corral's
		// conflicts (stale version, taken name, wrong state) heals by itself.
		w.Header().Set("x-should-retry", "false")
	}
	if code == http.StatusTooManyRequests {
		// A rate limit says when to come back (the SDKs honour it); a
		// quota (too many live sessions) does not heal by waiting.
		if secs, ok := retryAfterOf(err); ok {
			w.Header().Set("retry-after", strconv.Itoa(secs))
		} else {
			w.Header().Set("x-should-retry", "false")
		}
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(ErrorBody{
		Type:      "error",
		Error:     ErrorDetail{Type: errhttp.APIErrorType(err), Message: msg},
		RequestID: id,
	})
}

// NewGateway returns the REST gateway for the admin services, dialling the
// node's gRPC server at grpcAddr, a plaintext loopback listener of its own
// (the public one may be TLS). Close the returned connection on shutdown.
func NewGateway(ctx context.Context, grpcAddr string) (http.Handler, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(MaxMessageBytes), grpc.MaxCallRecvMsgSize(MaxMessageBytes)))
	if err != nil {
		return nil, nil, err
	}
	// snake_case field names, like the rest of corral's REST API.
	jsonpb := &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}
	mux := runtime.NewServeMux(
		runtime.WithErrorHandler(gatewayError),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, jsonpb),
		// A usage export that accepts CSV gets it (usage.go).
		runtime.WithMarshalerOption("text/csv", csvMarshaler{jsonpb}),
		// Pass the HTTP request id on, so both transports log the same id.
		runtime.WithMetadata(func(ctx context.Context, r *http.Request) metadata.MD {
			return metadata.Pairs(RequestIDHeader, RequestID(ctx))
		}),
		runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
		// Credentials travel on: Authorization always does; x-api-key too.
		runtime.WithIncomingHeaderMatcher(func(k string) (string, bool) {
			if strings.EqualFold(k, "X-Api-Key") {
				return "x-api-key", true
			}
			return runtime.DefaultHeaderMatcher(k)
		}),
	)
	for _, register := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		adminv1.RegisterClusterServiceHandler,
		adminv1.RegisterHostsServiceHandler,
		adminv1.RegisterOperatorKeysServiceHandler,
		adminv1.RegisterSandboxesServiceHandler,
		adminv1.RegisterTenantsServiceHandler,
		adminv1.RegisterUsageServiceHandler,
	} {
		if err := register(ctx, mux, conn); err != nil {
			conn.Close()
			return nil, nil, err
		}
	}
	// ?format=csv asks for CSV as Accept: text/csv does.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("format") == "csv" {
			r.Header.Set("Accept", "text/csv")
		}
		mux.ServeHTTP(w, r)
	})
	return h, conn, nil
}

// gatewayError writes a gRPC error from the gateway as the error envelope,
// translating the code back to a kind (errgrpc) so errhttp picks the HTTP
// status.
func gatewayError(ctx context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if bodyTooLarge(r) {
		// The gateway reports any body it could not read as a bad
		// request; this one was cut at its cap.
		WriteError(w, r, errdefs.TooLarge("request body is larger than %d bytes", MaxMessageBytes))
		return
	}
	st := status.Convert(err)
	kind := errgrpc.Kind(st.Code())
	if _, ok := err.(*runtime.HTTPStatusError); ok && st.Code() == codes.Unimplemented /* no route or method */ {
		kind = errdefs.NotFoundKind
	}
	var e error = &errdefs.Error{Kind: kind, Msg: st.Message()}
	if md, ok := runtime.ServerMetadataFromContext(ctx); ok {
		if v := md.TrailerMD.Get("retry-after"); len(v) > 0 {
			if secs, err := strconv.Atoi(v[0]); err == nil && secs > 0 {
				e = retryAfterError{error: e, secs: secs}
			}
		}
	}
	WriteError(w, r, e)
}
