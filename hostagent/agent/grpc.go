package agent

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/internal/errdefs"
)

// NewGRPCServer returns a gRPC server whose handlers may return errdefs
// errors: they become statuses through errdefs.GRPCCode, and panics become
// internal errors. The host side's servers (the agent's SandboxService, the
// test controller's HostService) use it; the control plane has its own.
func NewGRPCServer(log *slog.Logger, opts ...grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer recoverTo(log, info.FullMethod, &err)
			resp, err = h(ctx, req)
			return resp, ToStatus(err)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer recoverTo(log, info.FullMethod, &err)
			return ToStatus(h(srv, ss))
		}),
	)
	return grpc.NewServer(opts...)
}

func recoverTo(log *slog.Logger, method string, err *error) {
	if p := recover(); p != nil {
		log.Error("panic in grpc handler", "method", method, "panic", p, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "internal error")
	}
}

// ToStatus turns an error into a gRPC status error; statuses pass through.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := errdefs.GRPCCode(err)
	msg := err.Error()
	if code == codes.Internal {
		msg = "internal error: " + msg // the only caller is the control plane
	}
	return status.Error(code, msg)
}

// FromStatus turns a gRPC error back into an errdefs error of the matching
// kind, for callers of the host protocol.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &errdefs.Error{Kind: errdefs.FromGRPCCode(s.Code()), Msg: s.Message()}
}
