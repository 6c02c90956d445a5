package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/api/console"
)

// Every file the console serves carries the security headers; the page
// loads its script and style from files (the CSP allows nothing inline);
// /console redirects to /console/.
func TestHandlerServesFilesWithSecurityHeaders(t *testing.T) {
	srv := httptest.NewServer(console.Handler(console.Options{}))
	t.Cleanup(srv.Close)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		path, status, contentType, contains string
	}{
		{"/console/", "200 OK", "text/html", `<script src="console.js" defer></script>`},
		{"/console/console.js", "200 OK", "text/javascript", "textContent"},
		{"/console/console.css", "200 OK", "text/css", "progress"},
		{"/console", "301 Moved Permanently", "", ""},
		{"/console/nothing-here", "404 Not Found", "text/plain", ""},
	} {
		resp, err := client.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.Status != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.contentType) || !strings.Contains(string(body), tc.contains) {
			t.Errorf("GET %s: %s %s, body has %q: %v", tc.path, resp.Status, resp.Header.Get("Content-Type"), tc.contains, strings.Contains(string(body), tc.contains))
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != console.Policy {
			t.Errorf("GET %s: CSP %q", tc.path, got)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: headers %v", tc.path, resp.Header)
		}
		if tc.path == "/console" && resp.Header.Get("Location") != "/console/" {
			t.Errorf("GET /console: Location %q", resp.Header.Get("Location"))
		}
	}
}

// The policy allows scripts from this origin only, and the page has no
// inline script, style or event handler the policy would (rightly) block;
// the script never writes markup.
func TestNothingInline(t *testing.T) {
	if !strings.Contains(console.Policy, "script-src 'self';") || strings.Contains(console.Policy, "unsafe") {
		t.Fatalf("policy %q", console.Policy)
	}
	srv := httptest.NewServer(console.Handler(console.Options{}))
	t.Cleanup(srv.Close)
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return string(b)
	}
	page := get("/console/")
	for _, re := range []string{`<script(?:\s[^>]*)?>[^<]+</script>`, `\son[a-z]+=`, `<style`, `\sstyle=`} {
		if m := regexp.MustCompile(re).FindString(page); m != "" {
			t.Errorf("index.html has inline code %q", m)
		}
	}
	for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(page, -1) {
		if !strings.Contains(tag, ` src="`) {
			t.Errorf("index.html has an inline script: %s", tag)
		}
	}
	js := get("/console/console.js")
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(js, bad) {
			t.Errorf("console.js uses %s", bad)
		}
	}
}
