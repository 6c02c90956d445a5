package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/auth/authtest"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
)

// A tenant's user signs in with the server's OpenID Provider in a real
// browser: the sign-in form offers the provider's button; clicking it runs
// the authorization-code flow with PKCE through the real provider, whose
// login step signs in the test's user and sends the browser back with a
// code; the page has the server redeem it, drops it from the address bar
// and shows the user's tenant's agents (and not another tenant's). Before
// that, with nobody signed in at the provider, its refusal is shown as
// text, and a return the tab did not start is refused.
func TestConsoleSignInWithOIDC(t *testing.T) {
	tab, noPageErrors := browser(t, 3*time.Minute)

	op := authtest.Start(t)
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "console-node", OIDCIssuers: []auth.IssuerConfig{{
		Issuer: op.Issuer, Audience: "corral-console", TenantClaim: "org", GroupRoles: map[string][]string{"eng": {"developer"}},
		ConsoleClientID: "corral-console", ConsoleName: "Acme SSO",
	}}})
	base := "http://" + srv.HTTPAddr()
	op.AddPublicClient(authtest.PublicClient{ID: "corral-console", RedirectURIs: []string{base + "/console/"}})
	call(t, base, servertest.TenantKey(t, srv, "tenant_a"), "POST", "/v1/agents", map[string]any{"name": "agent-of-a", "model": "fake"}, nil)
	call(t, base, servertest.TenantKey(t, srv, "tenant_b"), "POST", "/v1/agents", map[string]any{"name": "agent-of-b", "model": "fake"}, nil)

	button := `button.provider[data-issuer="` + op.Issuer + `"]`
	do(t, tab, "open the console", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.CSS(button)))
	if b := text(t, tab, button); b != "Sign in with Acme SSO" {
		t.Errorf("the provider's button: %q", b)
	}
	screenshot(t, tab, "signin-providers")

	// Nobody is signed in at the provider: it sends the browser back with
	// access_denied, and the page says so.
	clickAway(t, tab, "sign in with nobody at the provider", button, 30*time.Second)
	until(t, tab, "the provider's refusal shown", `document.getElementById("signin-error").textContent.startsWith("Sign-in failed: Acme SSO said access_denied")`, 30*time.Second)
	if s, err := chromedp.Run(tab, chromedp.Evaluate[string](`location.search`)); err != nil || s != "" {
		t.Errorf("after the refusal the address still has %q (%v)", s, err)
	}

	// A return this tab did not start (a link someone sent, with a code of
	// theirs): refused before anything is redeemed.
	do(t, tab, "open a forged return", chromedp.Navigate(base+"/console/?code=forged&state=forged"))
	until(t, tab, "the forged return refused", `document.getElementById("signin-error").textContent.includes("this tab did not start that sign-in") && location.search === ""`, 30*time.Second)

	// alice of tenant_a signs in at the provider: the round trip ends on
	// her tenant's pages.
	op.SignIn(authtest.User{Subject: "alice", Claims: map[string]any{"org": "tenant_a", "groups": []string{"eng"}, "email": "alice@example.com"}})
	start := time.Now()
	clickAway(t, tab, "sign in with the provider", button, 30*time.Second)
	until(t, tab, "the tenant's navigation", `document.getElementById("nav").textContent === "AgentsSessionsFiles"`, 30*time.Second)
	t.Logf("signed in through the provider in %v", time.Since(start).Round(time.Millisecond))
	if href, err := chromedp.Run(tab, chromedp.Evaluate[string](`location.href`)); err != nil || strings.Contains(href, "code=") || strings.Contains(href, "state=") {
		t.Errorf("the sign-in code stayed in the address: %q (%v)", href, err)
	}
	if pending, err := chromedp.Run(tab, chromedp.Evaluate[bool](`sessionStorage.getItem("corral.console.oidc") === null && sessionStorage.getItem("corral.console.key").split(".").length === 3`)); err != nil || !pending {
		t.Errorf("after the sign-in sessionStorage holds %v (%v)", pending, err)
	}
	do(t, tab, "open the agents", chromedp.Click(chromedp.CSS(`#nav a[data-route="#/agents"]`)), chromedp.WaitVisible(chromedp.CSS("#view table")))
	if a := text(t, tab, "#view table tbody"); !strings.Contains(a, "agent-of-a") || strings.Contains(a, "agent-of-b") {
		t.Errorf("the agents alice sees: %q", a)
	}
	screenshot(t, tab, "signed-in-with-oidc")

	// Signing out forgets the token; the button is there for the next.
	do(t, tab, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.CSS(button)))
	if stored, err := chromedp.Run(tab, chromedp.Evaluate[int](`sessionStorage.length`)); err != nil || stored != 0 {
		t.Errorf("after sign-out sessionStorage holds %d items (%v)", stored, err)
	}
	noPageErrors()
}

// clickAway clicks sel, which sends the browser to another page (the
// provider, which sends it back with redirects only), and waits up to d for
// the next page to have loaded: the checks that follow read the page that
// came back, not the one that left (whose script context is gone).
func clickAway(t *testing.T, tab context.Context, what, sel string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, d)
	defer cancel()
	loads := chromedp.Events(ctx, page.LoadEventFired)
	do(t, tab, what, chromedp.Click(chromedp.CSS(sel)))
	for _, err := range loads {
		if err != nil {
			t.Fatalf("%s: waiting for the page to load: %v", what, err)
		}
		return
	}
	t.Fatalf("%s: no page loaded within %v", what, d)
}
