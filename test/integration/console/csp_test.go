package console

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"corral.dev/corral/controlplane/api/console"
)

// The browser enforces the console's Content-Security-Policy: a script
// injected into the page (as a tenant string would be, were it ever
// written as markup) does not run, and the browser reports the violation,
// which is what the other tests' page-error check catches.
func TestBrowserEnforcesThePolicy(t *testing.T) {
	tab, errs := startBrowser(t, time.Minute)
	srv := httptest.NewServer(console.Handler(console.Options{}))
	t.Cleanup(srv.Close)

	do(t, tab, "open the console", chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(chromedp.ID("key")))
	do(t, tab, "inject an inline script and handler", chromedp.Evaluate[chromedp.Void](`(() => {
		const s = document.createElement("script");
		s.textContent = "window.injected = 1";
		document.body.append(s);
		const d = document.createElement("div");
		d.setAttribute("onclick", "window.injected = 2");
		document.body.append(d);
		d.click();
	})()`))
	ran, err := chromedp.Run(tab, chromedp.Evaluate[bool](`window.injected !== undefined`))
	if err != nil || ran {
		t.Fatalf("an injected script ran (%v)", err)
	}
	for _, what := range []string{"inline script", "inline event handler"} {
		m, ok := errs.waitFor("Executing "+what+" violates the following Content Security Policy directive 'script-src 'self''", 30*time.Second)
		if !ok {
			t.Fatalf("no violation reported for the %s; saw %q", what, errs.all())
		}
		t.Logf("reported: %s", m)
	}
}
