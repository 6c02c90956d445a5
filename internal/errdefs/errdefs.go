// Package errdefs is corral's one error vocabulary: a handful of kinds that every
// package wraps its errors in. It knows no transport, as in containerd: the
// adapters errdefs/errhttp and errdefs/errgrpc are the single places where a
// kind becomes an HTTP or gRPC status, and a status a kind again.
//
// A package returns errdefs.NotFound("agent %s", id) or wraps an underlying
// error with fmt.Errorf("loading agent: %w", err); callers test the kind with
// errdefs.IsNotFound(err). Transports translate with errhttp.Status and
// errgrpc.Code and nowhere else.
package errdefs

import (
	"context"
	"errors"
	"fmt"
)

// Kind classifies an error by what the caller can do about it.
type Kind int

// The kinds. Unknown is the zero value: an error nobody classified, reported as
// internal.
const (
	Unknown Kind = iota
	InvalidArgumentKind
	NotFoundKind
	AlreadyExistsKind
	FailedPreconditionKind
	ConflictKind
	PermissionDeniedKind
	UnauthenticatedKind
	ResourceExhaustedKind
	UnavailableKind
	TooLargeKind
	CanceledKind
	DeadlineExceededKind
	// UnimplementedKind: the operation exists but this implementation (a
	// driver, a runtime) does not support it; retrying never helps.
	UnimplementedKind
)

var kindNames = map[Kind]string{
	Unknown:                "internal",
	InvalidArgumentKind:    "invalid_argument",
	NotFoundKind:           "not_found",
	AlreadyExistsKind:      "already_exists",
	FailedPreconditionKind: "failed_precondition",
	ConflictKind:           "conflict",
	PermissionDeniedKind:   "permission_denied",
	UnauthenticatedKind:    "unauthenticated",
	ResourceExhaustedKind:  "resource_exhausted",
	UnavailableKind:        "unavailable",
	TooLargeKind:           "too_large",
	CanceledKind:           "canceled",
	DeadlineExceededKind:   "deadline_exceeded",
	UnimplementedKind:      "unimplemented",
}

func (k Kind) String() string { return kindNames[k] }

// Error is an error with a kind. Its message is meant for the caller.
type Error struct {
	Kind Kind
	Msg  string
	Err  error // optional cause
}

func (e *Error) Error() string {
	if e.Err != nil && e.Msg != "" {
		return e.Msg + ": " + e.Err.Error()
	}
	if e.Err != nil {
		return e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

func newf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// Constructors, one per kind.
func InvalidArgument(format string, args ...any) error {
	return newf(InvalidArgumentKind, format, args...)
}
func NotFound(format string, args ...any) error      { return newf(NotFoundKind, format, args...) }
func AlreadyExists(format string, args ...any) error { return newf(AlreadyExistsKind, format, args...) }
func FailedPrecondition(format string, args ...any) error {
	return newf(FailedPreconditionKind, format, args...)
}
func Conflict(format string, args ...any) error { return newf(ConflictKind, format, args...) }
func PermissionDenied(format string, args ...any) error {
	return newf(PermissionDeniedKind, format, args...)
}
func Unauthenticated(format string, args ...any) error {
	return newf(UnauthenticatedKind, format, args...)
}
func ResourceExhausted(format string, args ...any) error {
	return newf(ResourceExhaustedKind, format, args...)
}
func Unavailable(format string, args ...any) error { return newf(UnavailableKind, format, args...) }
func TooLarge(format string, args ...any) error    { return newf(TooLargeKind, format, args...) }
func Unimplemented(format string, args ...any) error {
	return newf(UnimplementedKind, format, args...)
}

// Wrap gives err a kind, keeping it in the chain.
func Wrap(k Kind, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...), Err: err}
}

// KindOf reports the kind of the outermost classified error in err's chain.
// Context cancellation and deadlines are recognised without wrapping.
func KindOf(err error) Kind {
	if err == nil {
		return Unknown
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	switch {
	case errors.Is(err, context.Canceled):
		return CanceledKind
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceededKind
	}
	return Unknown
}

// Predicates, for callers that branch on a kind.
func IsNotFound(err error) bool           { return KindOf(err) == NotFoundKind }
func IsAlreadyExists(err error) bool      { return KindOf(err) == AlreadyExistsKind }
func IsInvalidArgument(err error) bool    { return KindOf(err) == InvalidArgumentKind }
func IsFailedPrecondition(err error) bool { return KindOf(err) == FailedPreconditionKind }
func IsConflict(err error) bool           { return KindOf(err) == ConflictKind }
func IsUnavailable(err error) bool        { return KindOf(err) == UnavailableKind }
func IsUnimplemented(err error) bool      { return KindOf(err) == UnimplementedKind }
