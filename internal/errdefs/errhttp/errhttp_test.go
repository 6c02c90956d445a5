package errhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestStatus(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{errdefs.InvalidArgument("bad"), http.StatusBadRequest},
		{errdefs.NotFound("x"), http.StatusNotFound},
		{errdefs.AlreadyExists("x"), http.StatusConflict},
		{errdefs.Conflict("x"), http.StatusConflict},
		{errdefs.FailedPrecondition("x"), http.StatusConflict},
		{errdefs.PermissionDenied("x"), http.StatusForbidden},
		{errdefs.Unauthenticated("x"), http.StatusUnauthorized},
		{errdefs.ResourceExhausted("x"), http.StatusTooManyRequests},
		{errdefs.Unavailable("x"), http.StatusServiceUnavailable},
		{errdefs.TooLarge("x"), http.StatusRequestEntityTooLarge},
		{fmt.Errorf("op: %w", context.Canceled), statusClientClosedRequest},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), http.StatusGatewayTimeout},
		{errors.New("boom"), http.StatusInternalServerError},
	}
	for _, tt := range tests {
		if got := Status(tt.err); got != tt.want {
			t.Errorf("Status(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

func TestAPIErrorType(t *testing.T) {
	tests := map[error]string{
		errdefs.InvalidArgument("x"):   "invalid_request_error",
		errdefs.Conflict("x"):          "invalid_request_error",
		errdefs.NotFound("x"):          "not_found_error",
		errdefs.Unauthenticated("x"):   "authentication_error",
		errdefs.PermissionDenied("x"):  "permission_error",
		errdefs.TooLarge("x"):          "request_too_large",
		errdefs.ResourceExhausted("x"): "rate_limit_error",
		errors.New("x"):                "api_error",
	}
	for err, want := range tests {
		if got := APIErrorType(err); got != want {
			t.Errorf("APIErrorType(%v kind %v) = %q, want %q", err, errdefs.KindOf(err), got, want)
		}
	}
}
