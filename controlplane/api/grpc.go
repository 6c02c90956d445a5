package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"corral.dev/corral/internal/errdefs/errgrpc"
)

// RequestIDHeader carries a request's id on both transports.
const RequestIDHeader = "request-id"

type requestIDKey struct{}

// RequestID returns the id of the request being served, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "req_" + hex.EncodeToString(b)
}

// NewGRPCServer returns a gRPC server with corral's interceptors installed:
// request ids, panics and error statuses, then authentication, rate limits,
// authorization and audit (sec). Callers register services on it; every
// method must have a rule in authz.Methods or it is refused. Messages are
// bounded by MaxMessageBytes both ways (a larger one is refused from its
// length prefix, unread), headers by MaxHeaderBytes, and a connection's
// handshake by 10 seconds.
func NewGRPCServer(log *slog.Logger, sec *Security, opts ...grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.ConnectionTimeout(10*time.Second),
		grpc.ChainUnaryInterceptor(unaryInterceptor(log), sec.unarySecurity()),
		grpc.ChainStreamInterceptor(streamInterceptor(log), sec.streamSecurity()),
	)
	return grpc.NewServer(opts...)
}

// streamInterceptor is unaryInterceptor for streaming methods.
func streamInterceptor(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		id := ""
		if md, ok := metadata.FromIncomingContext(ss.Context()); ok {
			if v := md.Get(RequestIDHeader); len(v) > 0 && len(v[0]) <= 64 {
				id = v[0]
			}
		}
		if id == "" {
			id = newRequestID()
		}
		_ = ss.SetHeader(metadata.Pairs(RequestIDHeader, id))
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in grpc stream handler", "method", info.FullMethod, "request_id", id, "panic", p, "stack", string(debug.Stack()))
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		err = handler(srv, &ctxStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), requestIDKey{}, id)})
		return errgrpc.ToStatus(err, false)
	}
}

// ctxStream is a server stream with a context of its own.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
	// recv, when set, sees every message received.
	recv func(m any) error
}

func (s *ctxStream) Context() context.Context { return s.ctx }

func (s *ctxStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.recv != nil {
		return s.recv(m)
	}
	return nil
}

// unaryInterceptor gives each call a request id (kept from the gateway when it
// sent one), recovers panics, logs the outcome and translates errors to gRPC
// statuses through errgrpc.
func unaryInterceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		start := time.Now()
		id := ""
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(RequestIDHeader); len(v) > 0 && len(v[0]) <= 64 {
				id = v[0]
			}
		}
		if id == "" {
			id = newRequestID()
		}
		ctx = context.WithValue(ctx, requestIDKey{}, id)
		_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDHeader, id))
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in grpc handler", "method", info.FullMethod, "request_id", id, "panic", p, "stack", string(debug.Stack()))
				err = status.Error(codes.Internal, "internal error")
				resp = nil
			}
			log.Debug("grpc call", "method", info.FullMethod, "request_id", id, "code", status.Code(err).String(), "duration", time.Since(start))
		}()
		resp, err = handler(ctx, req)
		return resp, errgrpc.ToStatus(err, false)
	}
}
