package api

import (
	"context"
	"net/http"
	"time"
)

// Requests are counted by the ServeMux pattern that served them ("GET
// /v1/sessions/{session_id}"), never by their path: a path carries ids, and
// a metric label per id grows without bound. The mux sets the pattern on
// the request it routes, which a middleware above it does not see (each
// layer passes its own copy on), so every mux is wrapped in RecordRoute,
// which copies the pattern into a note the outermost layer put in the
// context. The innermost mux's pattern wins: a request the public API
// served is "GET /v1/agents", one refused before its mux (no credentials)
// is "/v1/".

// ObserveFunc receives each finished request: its route pattern, status
// code and duration (for an event stream, how long it stayed open).
type ObserveFunc func(pattern string, status int, d time.Duration)

// routeNote is where the innermost mux leaves its pattern.
type routeNote struct{ pattern string }

type routeNoteKey struct{}

// RecordRoute wraps a ServeMux so that the request's route pattern reaches
// the request's observer.
func RecordRoute(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r)
		if n, ok := r.Context().Value(routeNoteKey{}).(*routeNote); ok && n.pattern == "" {
			n.pattern = r.Pattern
		}
	})
}

// withRouteNote gives the request a note for RecordRoute.
func withRouteNote(r *http.Request) (*http.Request, *routeNote) {
	n := &routeNote{}
	return r.WithContext(context.WithValue(r.Context(), routeNoteKey{}, n)), n
}
