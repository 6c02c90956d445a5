// Package errhttp is the HTTP adapter for errdefs: the one place where an
// error's kind becomes an HTTP status and the error.type of the public error
// envelope. errdefs itself knows no transport; handlers translate here and
// nowhere else.
package errhttp

import (
	"net/http"

	"corral.dev/corral/internal/errdefs"
)

// statusClientClosedRequest is the status for a request its client gave up
// on (nginx's 499; net/http has no name for it).
const statusClientClosedRequest = 499

// Status is the one mapping from an error's kind to an HTTP status.
func Status(err error) int {
	switch errdefs.KindOf(err) {
	case errdefs.InvalidArgumentKind:
		return http.StatusBadRequest
	case errdefs.NotFoundKind:
		return http.StatusNotFound
	case errdefs.AlreadyExistsKind, errdefs.ConflictKind, errdefs.FailedPreconditionKind:
		return http.StatusConflict
	case errdefs.PermissionDeniedKind:
		return http.StatusForbidden
	case errdefs.UnauthenticatedKind:
		return http.StatusUnauthorized
	case errdefs.ResourceExhaustedKind:
		return http.StatusTooManyRequests
	case errdefs.UnavailableKind:
		return http.StatusServiceUnavailable
	case errdefs.TooLargeKind:
		return http.StatusRequestEntityTooLarge
	case errdefs.CanceledKind:
		return statusClientClosedRequest
	case errdefs.DeadlineExceededKind:
		return http.StatusGatewayTimeout
	case errdefs.UnimplementedKind:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// APIErrorType is the one mapping from an error's kind to the error.type
// string of the public error envelope
// {"type":"error","error":{"type":...,"message":...}}, as the Managed Agents
// API names them. Conflicts are invalid_request_error there; the 409 status
// tells them apart.
func APIErrorType(err error) string {
	switch Status(err) {
	case http.StatusBadRequest, http.StatusConflict:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	return "api_error"
}
