package console

import (
	"embed"
	"io/fs"
	"log/slog"
	"net/http"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errhttp"
)

//go:embed static
var static embed.FS

// Policy is the Content-Security-Policy of every console response: this
// origin's scripts, styles, images and API only; no inline script or
// style, no plugins, no framing, no form posts elsewhere.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Options configure the console's handler.
type Options struct {
	// SignIn, when set, offers its issuers' console clients on the sign-in
	// form (ConfigPath) and redeems their sign-in codes (TokenPath).
	SignIn SignIn
	// WriteError writes an error response (api.WriteError: the one
	// mapping of errors to statuses and bodies); nil writes the status
	// alone.
	WriteError func(http.ResponseWriter, *http.Request, error)
	Logger     *slog.Logger
}

// Handler serves the console under /console/ (mount it at "/console/" and
// "GET /console"; /console redirects to /console/): its files and
// ConfigPath on GET, TokenPath on POST.
func Handler(opts Options) http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	if opts.WriteError == nil {
		opts.WriteError = func(w http.ResponseWriter, _ *http.Request, err error) {
			code := errhttp.Status(err)
			http.Error(w, http.StatusText(code), code)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := newSignInHandler(opts)
	files := http.StripPrefix("/console/", http.FileServer(http.FS(sub)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", Policy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change with the binary; a console left open after an
		// upgrade reloads the new ones.
		h.Set("Cache-Control", "no-cache")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == TokenPath:
			s.token(w, r)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			h.Set("Allow", "GET, HEAD")
			opts.WriteError(w, r, errdefs.NotFound("no route for %s %s", r.Method, r.URL.Path))
		case r.URL.Path == "/console":
			http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
		case r.URL.Path == ConfigPath:
			s.config(w, r)
		default:
			files.ServeHTTP(w, r)
		}
	})
}
