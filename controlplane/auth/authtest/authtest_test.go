package authtest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"

	"corral.dev/corral/controlplane/auth/authtest"
)

const verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk" // RFC 7636's example

// redeem posts a code to the provider's token endpoint as the public
// client and returns the status and the response's fields.
func redeem(t *testing.T, p *authtest.Provider, form url.Values) (int, map[string]any) {
	t.Helper()
	resp, err := http.PostForm(p.Issuer+"/oauth/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("token response %s: %v", b, err)
	}
	return resp.StatusCode, out
}

// A public client gets a code for the signed-in user and redeems it with
// its PKCE verifier for an ID token and a JWT access token that carry the
// user's claims, for the client's audience; a wrong verifier, a reused code
// and another redirect URI are refused, and with nobody signed in the
// browser comes back with access_denied.
func TestAuthorizationCodeWithPKCE(t *testing.T) {
	p := authtest.Start(t)
	const redirect = "http://127.0.0.1:1/console/"
	p.AddPublicClient(authtest.PublicClient{ID: "console", RedirectURIs: []string{redirect}})
	p.SignIn(authtest.User{Subject: "alice", Claims: map[string]any{"org": "tenant_a", "groups": []string{"eng"}, "email": "alice@example.com"}})

	form := func(code, v string) url.Values {
		return url.Values{"grant_type": {"authorization_code"}, "client_id": {"console"}, "code": {code}, "redirect_uri": {redirect}, "code_verifier": {v}}
	}
	code := p.AuthorizationCode(t, "console", redirect, verifier)
	if status, out := redeem(t, p, form(code, strings.Repeat("x", 43))); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("a wrong verifier: %d %v", status, out)
	}
	code = p.AuthorizationCode(t, "console", redirect, verifier)
	status, out := redeem(t, p, form(code, verifier))
	if status != http.StatusOK {
		t.Fatalf("redeeming: %d %v", status, out)
	}
	ctx := context.Background()
	provider, err := oidc.NewProvider(ctx, p.Issuer)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"id_token", "access_token"} {
		raw, _ := out[name].(string)
		tok, err := provider.Verifier(&oidc.Config{ClientID: "console"}).Verify(ctx, raw)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var claims struct {
			Org    string   `json:"org"`
			Groups []string `json:"groups"`
		}
		if err := tok.Claims(&claims); err != nil || tok.Subject != "alice" || claims.Org != "tenant_a" || len(claims.Groups) != 1 {
			t.Errorf("%s: subject %q, claims %+v (%v)", name, tok.Subject, claims, err)
		}
	}
	if status, out := redeem(t, p, form(code, verifier)); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("a code used twice: %d %v", status, out)
	}

	// Another redirect URI: the provider refuses to send the browser there.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	q := url.Values{"response_type": {"code"}, "client_id": {"console"}, "redirect_uri": {"http://evil.example/console/"}, "scope": {"openid"},
		"code_challenge": {"E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"}, "code_challenge_method": {"S256"}}
	resp, err := noFollow.Get(p.Issuer + "/authorize?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, "http://evil.example") {
		t.Errorf("sent to an unregistered redirect URI: %s", loc)
	}

	// Nobody signed in: back to the client with access_denied.
	p.SignOut()
	q.Set("redirect_uri", redirect)
	resp, err = noFollow.Get(p.Issuer + "/authorize?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = noFollow.Get(resp.Header.Get("Location")) // the login step
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	back, _ := url.Parse(resp.Header.Get("Location"))
	if !strings.HasPrefix(back.String(), redirect) || back.Query().Get("error") != "access_denied" {
		t.Errorf("nobody signed in: %s to %q", resp.Status, back)
	}
}
