package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Policy is the Content-Security-Policy of every console response: this
// origin's scripts, styles, images and API only; no inline script or
// style, no plugins, no framing, no form posts elsewhere.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files under /console/ (mount it at
// "GET /console/"); /console itself redirects there.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
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
		if r.URL.Path == "/console" {
			http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
			return
		}
		files.ServeHTTP(w, r)
	})
}
