// Package errgrpc is the gRPC adapter for errdefs: the one place where an
// error's kind becomes a gRPC status code and a status becomes a kind again.
// errdefs itself knows no transport; servers and clients that speak gRPC
// translate here and nowhere else.
//
//	server: handler error ──ToStatus──▶ status (code, message) ──wire──▶
//	client: ◀──wire── status ──FromStatus──▶ *errdefs.Error (kind, message)
package errgrpc

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/internal/errdefs"
)

// Code is the one mapping from an error's kind to a gRPC status code.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	switch errdefs.KindOf(err) {
	case errdefs.InvalidArgumentKind:
		return codes.InvalidArgument
	case errdefs.NotFoundKind:
		return codes.NotFound
	case errdefs.AlreadyExistsKind:
		return codes.AlreadyExists
	case errdefs.FailedPreconditionKind:
		return codes.FailedPrecondition
	case errdefs.ConflictKind:
		return codes.Aborted
	case errdefs.PermissionDeniedKind:
		return codes.PermissionDenied
	case errdefs.UnauthenticatedKind:
		return codes.Unauthenticated
	case errdefs.ResourceExhaustedKind:
		return codes.ResourceExhausted
	case errdefs.UnavailableKind:
		return codes.Unavailable
	case errdefs.TooLargeKind:
		return codes.ResourceExhausted
	case errdefs.CanceledKind:
		return codes.Canceled
	case errdefs.DeadlineExceededKind:
		return codes.DeadlineExceeded
	case errdefs.UnimplementedKind:
		return codes.Unimplemented
	}
	return codes.Internal
}

// Kind is the inverse of Code, for clients that turn a gRPC status code back
// into a kind.
func Kind(c codes.Code) errdefs.Kind {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange:
		return errdefs.InvalidArgumentKind
	case codes.NotFound:
		return errdefs.NotFoundKind
	case codes.AlreadyExists:
		return errdefs.AlreadyExistsKind
	case codes.FailedPrecondition:
		return errdefs.FailedPreconditionKind
	case codes.Aborted:
		return errdefs.ConflictKind
	case codes.PermissionDenied:
		return errdefs.PermissionDeniedKind
	case codes.Unauthenticated:
		return errdefs.UnauthenticatedKind
	case codes.ResourceExhausted:
		return errdefs.ResourceExhaustedKind
	case codes.Unavailable:
		return errdefs.UnavailableKind
	case codes.Canceled:
		return errdefs.CanceledKind
	case codes.DeadlineExceeded:
		return errdefs.DeadlineExceededKind
	case codes.Unimplemented:
		return errdefs.UnimplementedKind
	}
	return errdefs.Unknown
}

// ToStatus turns err into a gRPC status error with the code Code maps its
// kind to; errors that already are statuses pass through. An unclassified
// (internal) error keeps its text only when exposeInternal is set: servers
// whose callers are trusted (a host agent answering its control plane) say
// what broke; public servers say "internal error" and log the rest.
func ToStatus(err error, exposeInternal bool) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := Code(err)
	msg := err.Error()
	if code == codes.Internal {
		msg = "internal error"
		if exposeInternal {
			msg += ": " + err.Error()
		}
	}
	return status.Error(code, msg)
}

// FromStatus turns a gRPC status error back into an error of the matching
// kind, for clients. Other errors pass through.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &errdefs.Error{Kind: Kind(s.Code()), Msg: s.Message()}
}
