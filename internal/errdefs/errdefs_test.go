package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
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
	}{
		{InvalidArgument("bad"), http.StatusBadRequest},
		{NotFound("x"), http.StatusNotFound},
		{AlreadyExists("x"), http.StatusConflict},
		{Conflict("x"), http.StatusConflict},
		{FailedPrecondition("x"), http.StatusConflict},
		{PermissionDenied("x"), http.StatusForbidden},
		{Unauthenticated("x"), http.StatusUnauthorized},
		{ResourceExhausted("x"), http.StatusTooManyRequests},
		{Unavailable("x"), http.StatusServiceUnavailable},
		{TooLarge("x"), http.StatusRequestEntityTooLarge},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), http.StatusGatewayTimeout},
		{errors.New("boom"), http.StatusInternalServerError},
	}
	for _, tt := range tests {
		if got := HTTPStatus(tt.err); got != tt.http {
			t.Errorf("HTTPStatus(%v) = %d, want %d", tt.err, got, tt.http)
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
