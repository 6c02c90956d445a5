package api

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"corral.dev/corral/controlplane/api/console"
	"corral.dev/corral/internal/errdefs"
)

// Limits on what a caller may send, applied before routing and before
// authentication: an unauthenticated caller can make the node read no more
// than these.
const (
	// MaxMessageBytes bounds a gRPC message of the admin API either way,
	// and so an admin REST body (the gateway turns it into one message).
	MaxMessageBytes = 4 << 20
	// MaxHeaderBytes bounds an HTTP request's header block (credentials
	// are at most 8 KiB; OIDC tokens fit well within).
	MaxHeaderBytes = 64 << 10
	// ReadTimeout bounds reading one request, headers and body (an
	// http.Server's ReadTimeout; it does not end long responses such as
	// event streams and drains).
	ReadTimeout = time.Minute
)

// UploadPath is the one route whose body may be larger than the public
// API's limit: a file upload (HandlerOptions.FileUploadBodyLimit).
const UploadPath = "/v1/files"

// limitBody caps r's body by route before next sees it: publicLimit for
// the public API (/v1/), except an upload (POST /v1/files), which may be
// uploadLimit; MaxMessageBytes for the admin gateway (/admin/);
// console.MaxTokenRequestBytes for the console's sign-in; nothing for the
// rest (health and readiness take no body). A declared length over the
// cap gets 413 at once, unread; a body that turns out longer fails its
// reader at the cap (http.MaxBytesReader), which the handlers report as
// 413.
func limitBody(publicLimit, uploadLimit int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := int64(0)
		switch {
		case r.Method == http.MethodPost && r.URL.Path == UploadPath:
			limit = uploadLimit
		case r.Method == http.MethodPost && r.URL.Path == console.TokenPath:
			limit = console.MaxTokenRequestBytes
		case strings.HasPrefix(r.URL.Path, "/v1/"):
			limit = publicLimit
		case strings.HasPrefix(r.URL.Path, "/admin/"):
			limit = MaxMessageBytes
		}
		if r.ContentLength > limit {
			writeTooLarge(w, r, limit)
			return
		}
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		b := &limitedBody{ReadCloser: http.MaxBytesReader(w, r.Body, limit)}
		r.Body = b
		if limit == 0 {
			// No route here reads a body: look for one (a chunked body
			// declares no length) so it is refused, not ignored.
			var one [1]byte
			if _, err := io.ReadFull(b, one[:]); !errors.Is(err, io.EOF) {
				writeTooLarge(w, r, limit)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func writeTooLarge(w http.ResponseWriter, r *http.Request, limit int64) {
	if limit == 0 {
		WriteError(w, r, errdefs.TooLarge("%s takes no request body", r.URL.Path))
		return
	}
	WriteError(w, r, errdefs.TooLarge("request body is larger than %d bytes", limit))
}

// limitedBody is a request body under its cap; it remembers whether the cap
// was hit (the gateway reports any body error as a bad request, and asks
// here to tell a 413 from a 400).
type limitedBody struct {
	io.ReadCloser
	exceeded atomic.Bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var tooBig *http.MaxBytesError
	if err != nil && errors.As(err, &tooBig) {
		b.exceeded.Store(true)
	}
	return n, err
}

// bodyTooLarge reports whether r's body was cut at its cap.
func bodyTooLarge(r *http.Request) bool {
	b, ok := r.Body.(*limitedBody)
	return ok && b.exceeded.Load()
}
