package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/controlplane/api/console"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/auth/authtest"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/errdefs"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// RFC 7636's example verifier.
const verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"

type signInSetup struct {
	base     string // the node's URL
	redirect string // its console's redirect URI
	op       *authtest.Provider
	// dead is a console issuer nobody serves.
	dead string
	// keyA and keyB are API keys of tenant_a and tenant_b.
	keyA, keyB string
}

// setup starts a real OpenID Provider with the console's public client,
// and a node that trusts the provider for tenant_a's users (with a
// console client), an issuer without one, and a console issuer that
// cannot be reached.
func setup(t *testing.T) signInSetup {
	t.Helper()
	op, other := authtest.Start(t), authtest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "console-node", OIDCIssuers: []auth.IssuerConfig{
		{Issuer: op.Issuer, Audience: "corral-console", TenantClaim: "org", GroupRoles: map[string][]string{"eng": {"developer"}},
			ConsoleClientID: "corral-console", ConsoleName: "Acme SSO"},
		{Issuer: other.Issuer, Audience: "corral", Tenant: "tenant_a"},
		{Issuer: dead, Audience: "corral", Tenant: "tenant_a", ConsoleClientID: "corral"},
	}})
	s := signInSetup{base: "http://" + srv.HTTPAddr(), op: op, dead: dead}
	s.redirect = s.base + "/console/"
	op.AddPublicClient(authtest.PublicClient{ID: "corral-console", RedirectURIs: []string{s.redirect}})
	s.keyA, s.keyB = servertest.TenantKey(t, srv, "tenant_a"), servertest.TenantKey(t, srv, "tenant_b")
	return s
}

// do sends a request and returns its status, headers and body.
func do(t *testing.T, method, url, contentType, bearer string, body io.Reader) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, string(b)
}

// message is an error envelope's message.
func message(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an error envelope: %s", body)
	}
	return e.Error.Message
}

func exchangeBody(issuer, code, v, redirect string) string {
	b, _ := json.Marshal(map[string]string{"issuer": issuer, "code": code, "code_verifier": v, "redirect_uri": redirect})
	return string(b)
}

// The sign-in form's list: each issuer with a console client, its
// authorization endpoint from discovery (empty for the one that cannot be
// reached), in configuration order; an issuer without one is not listed.
func TestConfigListsConsoleIssuers(t *testing.T) {
	s := setup(t)
	status, h, body := do(t, "GET", s.base+console.ConfigPath, "", "", nil)
	if status != http.StatusOK || h.Get("Content-Type") != "application/json" || h.Get("Cache-Control") != "no-store" || h.Get("Content-Security-Policy") != console.Policy {
		t.Fatalf("GET %s: %d %v %s", console.ConfigPath, status, h, body)
	}
	var got struct {
		Providers []map[string]string `json:"providers"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]string{
		{"issuer": s.op.Issuer, "client_id": "corral-console", "scopes": "openid profile email", "name": "Acme SSO", "authorization_endpoint": s.op.Issuer + "/authorize"},
		{"issuer": s.dead, "client_id": "corral", "scopes": "openid profile email", "name": strings.TrimPrefix(s.dead, "http://"), "authorization_endpoint": ""},
	}
	if len(got.Providers) != len(want) {
		t.Fatalf("providers %v", got.Providers)
	}
	for i := range want {
		for k, v := range want[i] {
			if got.Providers[i][k] != v {
				t.Errorf("provider %d: %s = %q, want %q", i, k, got.Providers[i][k], v)
			}
		}
		if len(got.Providers[i]) != len(want[i]) {
			t.Errorf("provider %d has other fields: %v", i, got.Providers[i])
		}
	}
}

// A code redeemed through the console gives a token the API accepts for
// the user's tenant; everything else is refused with a reason of ours,
// never the provider's words: issuers not configured for the console
// (matched exactly), bodies too large or malformed, a redirect URI or
// origin that is not the console's, a bad, reused or mismatched code.
func TestTokenExchange(t *testing.T) {
	s := setup(t)
	s.op.SignIn(authtest.User{Subject: "alice", Claims: map[string]any{"org": "tenant_a", "groups": []string{"eng"}, "email": "alice@example.com"}})
	post := func(body, contentType, origin string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", s.base+console.TokenPath, strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, resp.Header, string(b)
	}

	const generic = "the sign-in provider did not accept the sign-in (its code may have expired or been used): sign in again"
	for _, tc := range []struct {
		name, body, contentType, origin string
		status                          int
		message                         string
	}{
		{"unknown issuer", exchangeBody("https://idp.example", "c", verifier, s.redirect), "", "", 400, "issuer is not one of this console's sign-in providers"},
		{"issuer with a slash added", exchangeBody(s.op.Issuer+"/", "c", verifier, s.redirect), "", "", 400, "issuer is not one of this console's sign-in providers"},
		{"too large", exchangeBody(s.op.Issuer, strings.Repeat("c", console.MaxTokenRequestBytes), verifier, s.redirect), "", "", 413, ""},
		{"not JSON", "issuer=x", "application/x-www-form-urlencoded", "", 400, "a sign-in is sent as application/json"},
		{"unknown field", `{"issuer":"x","client_secret":"y"}`, "", "", 400, ""},
		{"short verifier", exchangeBody(s.op.Issuer, "c", "abc", s.redirect), "", "", 400, ""},
		{"redirect elsewhere", exchangeBody(s.op.Issuer, "c", verifier, "https://evil.example/console/"), "", s.base, 400, "redirect_uri must be this console's address, <origin>/console/"},
		{"redirect to another path", exchangeBody(s.op.Issuer, "c", verifier, s.base+"/v1/"), "", "", 400, "redirect_uri must be this console's address, <origin>/console/"},
		{"bad code", exchangeBody(s.op.Issuer, "nonsense", verifier, s.redirect), "", s.base, 400, generic},
		{"unreachable provider", exchangeBody(s.dead, "c", verifier, s.dead+"/console/"), "", "", 503, ""},
	} {
		if tc.contentType == "" {
			tc.contentType = "application/json"
		}
		status, _, body := post(tc.body, tc.contentType, tc.origin)
		if status != tc.status || (tc.message != "" && message(t, body) != tc.message) {
			t.Errorf("%s: %d %s", tc.name, status, body)
		}
		if strings.Contains(body, "invalid code") || strings.Contains(body, "connection refused") {
			t.Errorf("%s: the provider's or the network's words reached the browser: %s", tc.name, body)
		}
	}

	// A chunked body (no declared length) is cut at the cap too.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(exchangeBody(s.op.Issuer, strings.Repeat("c", 2*console.MaxTokenRequestBytes), verifier, s.redirect)))
		pw.Close()
	}()
	if status, _, body := do(t, "POST", s.base+console.TokenPath, "application/json", "", pr); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked body over the cap: %d %s", status, body)
	}

	// A code of the page's, with another origin's page posting it.
	code := s.op.AuthorizationCode(t, "corral-console", s.redirect, verifier)
	if status, _, body := post(exchangeBody(s.op.Issuer, code, verifier, s.redirect), "application/json", "https://evil.example"); status != 400 {
		t.Errorf("another origin: %d %s", status, body)
	}
	// The right code with another verifier: the provider refuses, and the
	// browser reads our words.
	code = s.op.AuthorizationCode(t, "corral-console", s.redirect, verifier)
	if status, _, body := post(exchangeBody(s.op.Issuer, code, strings.Repeat("v", 43), s.redirect), "application/json", s.base); status != 400 || message(t, body) != generic {
		t.Errorf("a wrong verifier: %d %s", status, body)
	}

	// The real thing: a token the API takes as alice of tenant_a.
	code = s.op.AuthorizationCode(t, "corral-console", s.redirect, verifier)
	status, h, body := post(exchangeBody(s.op.Issuer, code, verifier, s.redirect), "application/json", s.base)
	if status != http.StatusOK || h.Get("Cache-Control") != "no-store" {
		t.Fatalf("exchange: %d %v %s", status, h, body)
	}
	var tok struct{ Token string }
	if err := json.Unmarshal([]byte(body), &tok); err != nil || strings.Count(tok.Token, ".") != 2 {
		t.Fatalf("exchange: %s (%v)", body, err)
	}
	for key, name := range map[string]string{s.keyA: "agent-of-a", s.keyB: "agent-of-b"} {
		if status, _, body := do(t, "POST", s.base+"/v1/agents", "application/json", key, strings.NewReader(`{"name":"`+name+`","model":"fake"}`)); status != http.StatusOK {
			t.Fatalf("creating %s: %d %s", name, status, body)
		}
	}
	status, _, body = do(t, "GET", s.base+"/v1/agents", "", tok.Token, nil)
	if status != http.StatusOK || !strings.Contains(body, "agent-of-a") || strings.Contains(body, "agent-of-b") {
		t.Fatalf("GET /v1/agents with the console's token: %d %s", status, body)
	}
	// alice's groups made her a developer: she builds agents.
	if status, _, body := do(t, "POST", s.base+"/v1/agents", "application/json", tok.Token, strings.NewReader(`{"name":"alices-agent","model":"fake"}`)); status != http.StatusOK {
		t.Errorf("creating an agent with the console's token: %d %s", status, body)
	}
	// The same code again: used.
	if status, _, body := post(exchangeBody(s.op.Issuer, code, verifier, s.redirect), "application/json", s.base); status != 400 || message(t, body) != generic {
		t.Errorf("a code used twice: %d %s", status, body)
	}

	// A user whose token names a tenant that does not exist: the API's own
	// refusal (posted with the Origin "null" a browser may send for a
	// no-referrer page: the exchange goes ahead).
	s.op.SignIn(authtest.User{Subject: "mallory", Claims: map[string]any{"org": "tenant_ghost", "groups": []string{"eng"}}})
	code = s.op.AuthorizationCode(t, "corral-console", s.redirect, verifier)
	if status, _, body := post(exchangeBody(s.op.Issuer, code, verifier, s.redirect), "application/json", "null"); status != http.StatusUnauthorized || !strings.Contains(message(t, body), "tenant_ghost does not exist") {
		t.Errorf("a tenant that does not exist: %d %s", status, body)
	}
}

// Without sign-in providers the console lists none and redeems nothing;
// methods other than GET are refused on the files.
func TestNoSignInProviders(t *testing.T) {
	srv := httpServer(t, console.Handler(console.Options{}))
	status, _, body := do(t, "GET", srv+console.ConfigPath, "", "", nil)
	if status != http.StatusOK || strings.TrimSpace(body) != `{"providers":[]}` {
		t.Errorf("config: %d %s", status, body)
	}
	if status, _, _ := do(t, "POST", srv+console.TokenPath, "application/json", "", bytes.NewReader([]byte(`{}`))); status != http.StatusNotFound {
		t.Errorf("token without providers: %d", status)
	}
	if status, h, _ := do(t, "DELETE", srv+"/console/console.js", "", "", nil); status != http.StatusNotFound || h.Get("Allow") != "GET, HEAD" {
		t.Errorf("DELETE a file: %d %v", status, h)
	}
}

// httpServer serves h on loopback until the test ends and returns its URL.
func httpServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// scriptedSignIn offers one issuer whose token endpoint is tokenURL, and
// accepts the token "good" alone: for the provider's misbehaviour, which a
// real provider does not do on demand.
type scriptedSignIn struct{ issuer, tokenURL string }

func (s scriptedSignIn) Providers() []console.Provider {
	return []console.Provider{{Issuer: s.issuer, ClientID: "console", Scopes: "openid", Name: "IdP"}}
}

func (s scriptedSignIn) Endpoints(context.Context, string) (console.Endpoints, error) {
	return console.Endpoints{Authorization: s.issuer + "/authorize", Token: s.tokenURL}, nil
}

func (s scriptedSignIn) Verify(_ context.Context, token string) error {
	if token == "good" {
		return nil
	}
	return errdefs.Unauthenticated("invalid token")
}

// syncBuffer is a log the handler writes from its requests' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A provider's token endpoint that fails, redirects, answers too much or
// not JSON gets the browser a 503 of ours; a refusal a 400 of ours; what
// the provider said is logged and never reaches the browser. The code is
// posted as a public client (no secret, the verifier); an opaque access
// token falls back to the ID token; a token the API refuses is refused.
// At most a few exchanges run at once: the next is told to come back.
func TestTokenExchangeWithAMisbehavingProvider(t *testing.T) {
	const secret = "UPSTREAM-SECRET"
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	var (
		mu    sync.Mutex
		mode  string
		form  url.Values
		held  = make(chan struct{}, 64) // one per stalled request
		allow = make(chan struct{})     // closed: stalled requests answer
	)
	token := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		mu.Lock()
		m := mode
		form = r.PostForm
		mu.Unlock()
		switch m {
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":"server_error","error_description":"`+secret+`"}`)
		case "refuse":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"invalid_grant","error_description":"`+secret+`"}`)
		case "redirect":
			http.Redirect(w, r, other.URL, http.StatusTemporaryRedirect)
		case "huge":
			_, _ = io.WriteString(w, `{"access_token":"`+strings.Repeat("x", 70<<10)+`"}`)
		case "not json":
			_, _ = io.WriteString(w, "<html>"+secret)
		case "opaque access token":
			_, _ = io.WriteString(w, `{"access_token":"opaque","id_token":"good"}`)
		case "refused token":
			_, _ = io.WriteString(w, `{"access_token":"bad"}`)
		case "stall":
			held <- struct{}{}
			<-allow
			_, _ = io.WriteString(w, `{"access_token":"good"}`)
		}
	}))
	t.Cleanup(token.Close)
	var log syncBuffer
	base := httpServer(t, console.Handler(console.Options{
		SignIn: scriptedSignIn{issuer: "https://idp.example", tokenURL: token.URL}, Logger: slog.New(slog.NewTextHandler(&log, nil)),
	}))
	redirect := base + "/console/"
	exchange := func() (int, string) {
		status, _, body := do(t, "POST", base+console.TokenPath, "application/json", "", strings.NewReader(exchangeBody("https://idp.example", "the-code", verifier, redirect)))
		return status, body
	}

	for _, tc := range []struct {
		mode   string
		status int
	}{
		{"fail", 503}, {"refuse", 400}, {"redirect", 503}, {"huge", 503}, {"not json", 503},
		{"opaque access token", 200}, {"refused token", 401},
	} {
		mu.Lock()
		mode = tc.mode
		mu.Unlock()
		status, body := exchange()
		if status != tc.status || strings.Contains(body, secret) || strings.Contains(body, "xxxx") {
			t.Errorf("%s: %d %.200s", tc.mode, status, body)
		}
		if tc.mode == "opaque access token" && strings.TrimSpace(body) != `{"token":"good"}` {
			t.Errorf("%s: %s", tc.mode, body)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect was followed: %d requests elsewhere", n)
	}
	if !strings.Contains(log.String(), secret) {
		t.Errorf("what the provider said is not in the log:\n%s", log.String())
	}
	mu.Lock()
	want := url.Values{"grant_type": {"authorization_code"}, "code": {"the-code"}, "redirect_uri": {redirect}, "client_id": {"console"}, "code_verifier": {verifier}}
	if form.Encode() != want.Encode() {
		t.Errorf("posted %v, want %v", form, want)
	}
	mode = "stall"
	mu.Unlock()

	// Fill every slot with an exchange the provider holds; one more is
	// refused at once; released, the held ones succeed.
	const slots = 16
	results := make(chan int, slots)
	for range slots {
		go func() {
			status, _ := exchange()
			results <- status
		}()
	}
	for i := range slots {
		select {
		case <-held:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d exchanges reached the provider", i, slots)
		}
	}
	if status, body := exchange(); status != http.StatusTooManyRequests {
		t.Errorf("an exchange past the cap: %d %s", status, body)
	}
	close(allow)
	for range slots {
		if status := <-results; status != http.StatusOK {
			t.Errorf("a held exchange: %d", status)
		}
	}
}
