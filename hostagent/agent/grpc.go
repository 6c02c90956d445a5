package agent

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/internal/errdefs/errgrpc"
)

// NewGRPCServer returns a gRPC server whose handlers may return errdefs
// errors: they become statuses through errgrpc.Code, and panics become
// internal errors. The host side's servers (the agent's SandboxService, the
// test controller's HostService) use it; the control plane has its own.
func NewGRPCServer(log *slog.Logger, opts ...grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer recoverTo(log, info.FullMethod, &err)
			resp, err = h(ctx, req)
			return resp, errgrpc.ToStatus(err, true)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer recoverTo(log, info.FullMethod, &err)
			return errgrpc.ToStatus(h(srv, ss), true)
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
