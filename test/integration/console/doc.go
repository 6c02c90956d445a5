// Package console drives corral's web console (/console/) in a real
// headless Chromium (Debian's chromium package, `make chromium`) through
// the DevTools protocol (chromedp), against a node started in process on a
// private PostgreSQL with a real host agent: a tenant signs in, watches a
// session's live stream, approves an always_ask tool call and sees its
// result; an operator sees the host with its provider and health. The
// tests read the page's text, not only that it loaded, and keep
// screenshots as artifacts (go test -artifacts -outputdir DIR).
package console
