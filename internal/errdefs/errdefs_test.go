package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
)

func TestKindSurvivesWrapping(t *testing.T) {
	base := NotFound("agent %s", "agent_1")
	wrapped := fmt.Errorf("loading session: %w", base)
	if !IsNotFound(wrapped) {
		t.Fatalf("IsNotFound(%v) = false after wrapping", wrapped)
	}
	if got, want := wrapped.Error(), "loading session: agent agent_1"; got != want {
		t.Fatalf("message = %q, want %q", got, want)
	}
}

func TestWrapKeepsCause(t *testing.T) {
	cause := errors.New("connection refused")
	err := Wrap(UnavailableKind, cause, "database")
	if !errors.Is(err, cause) {
		t.Fatal("Wrap dropped the cause from the chain")
	}
	if got := err.Error(); got != "database: connection refused" {
		t.Fatalf("message = %q", got)
	}
	if Wrap(UnavailableKind, nil, "x") != nil {
		t.Fatal("Wrap(nil) must be nil")
	}
}

func TestStatusMapping(t *testing.T) {
	tests := []struct {
		err  error
		http int
		grpc codes.Code
	}{
		{InvalidArgument("bad"), http.StatusBadRequest, codes.InvalidArgument},
		{NotFound("x"), http.StatusNotFound, codes.NotFound},
		{AlreadyExists("x"), http.StatusConflict, codes.AlreadyExists},
		{Conflict("x"), http.StatusConflict, codes.Aborted},
		{FailedPrecondition("x"), http.StatusConflict, codes.FailedPrecondition},
		{PermissionDenied("x"), http.StatusForbidden, codes.PermissionDenied},
		{Unauthenticated("x"), http.StatusUnauthorized, codes.Unauthenticated},
		{ResourceExhausted("x"), http.StatusTooManyRequests, codes.ResourceExhausted},
		{Unavailable("x"), http.StatusServiceUnavailable, codes.Unavailable},
		{TooLarge("x"), http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), http.StatusGatewayTimeout, codes.DeadlineExceeded},
		{errors.New("boom"), http.StatusInternalServerError, codes.Internal},
	}
	for _, tt := range tests {
		if got := HTTPStatus(tt.err); got != tt.http {
			t.Errorf("HTTPStatus(%v) = %d, want %d", tt.err, got, tt.http)
		}
		if got := GRPCCode(tt.err); got != tt.grpc {
			t.Errorf("GRPCCode(%v) = %v, want %v", tt.err, got, tt.grpc)
		}
	}
}

func TestGRPCRoundTrip(t *testing.T) {
	for k := InvalidArgumentKind; k <= DeadlineExceededKind; k++ {
		if k == TooLargeKind {
			continue // shares ResourceExhausted on the gRPC side
		}
		err := &Error{Kind: k, Msg: "x"}
		if got := FromGRPCCode(GRPCCode(err)); got != k {
			t.Errorf("kind %v: round trip through gRPC gave %v", k, got)
		}
	}
}

func TestAPIErrorType(t *testing.T) {
	tests := map[error]string{
		InvalidArgument("x"):   "invalid_request_error",
		Conflict("x"):          "invalid_request_error",
		NotFound("x"):          "not_found_error",
		Unauthenticated("x"):   "authentication_error",
		PermissionDenied("x"):  "permission_error",
		TooLarge("x"):          "request_too_large",
		ResourceExhausted("x"): "rate_limit_error",
		errors.New("x"):        "api_error",
	}
	for err, want := range tests {
		if got := APIErrorType(err); got != want {
			t.Errorf("APIErrorType(%v kind %v) = %q, want %q", err, KindOf(err), got, want)
		}
	}
}

func TestGRPCStatusRoundTrip(t *testing.T) {
	err := FromGRPCStatus(GRPCStatus(NotFound("sandbox %s", "k"), false))
	if !IsNotFound(err) || err.Error() != "sandbox k" {
		t.Fatalf("round trip gave %v (%v)", err, KindOf(err))
	}
	internal := errors.New("disk on fire")
	if got := FromGRPCStatus(GRPCStatus(internal, false)).Error(); got != "internal error" {
		t.Fatalf("public server leaked %q", got)
	}
	if got := FromGRPCStatus(GRPCStatus(internal, true)).Error(); got != "internal error: disk on fire" {
		t.Fatalf("trusted server said %q", got)
	}
	if GRPCStatus(nil, true) != nil || FromGRPCStatus(nil) != nil {
		t.Fatal("nil must stay nil")
	}
}
