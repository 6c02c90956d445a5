// Package authtest serves a real OpenID Provider inside a test: zitadel's
// certified op package with discovery, a JWKS endpoint, a token endpoint
// for the client-credentials grant over in-memory service clients the test
// registers, and the authorization-code grant with PKCE for public clients
// (a browser's). Tokens are what any provider issues (JWT access tokens and
// ID tokens signed with the provider's key); the test controls audience,
// lifetime, claims and which key signs.
//
// The authorization-code flow needs no human: the provider's login step
// signs in, without asking, the user the test signed in (SignIn), and sends
// the browser back with a code; with nobody signed in it sends it back
// with access_denied.
//
//	browser ─/authorize─▶ op (checks client, redirect URI, PKCE challenge)
//	   ─▶ /login?id= (signs in the test's user) ─▶ /authorize/callback?id=
//	   ─▶ redirect_uri?code=&state= ─▶ client ─POST /oauth/token (code, verifier)─▶ tokens
package authtest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Client is a service client of the provider (client-credentials grant).
type Client struct {
	ID, Secret string
	// Audience goes into the token's aud claim.
	Audience []string
	// Claims are added to every token (tenant, groups, ...).
	Claims map[string]any
	// Lifetime of its tokens; negative issues tokens that have already
	// expired. Default 5 minutes.
	Lifetime time.Duration
}

// PublicClient is a browser's client of the provider: the
// authorization-code grant with PKCE (RFC 7636), no secret. Its tokens'
// audience is its ID, as with most providers.
type PublicClient struct {
	ID string
	// RedirectURIs are where the provider may send the browser back, matched
	// exactly; http URLs are allowed (tests serve on loopback).
	RedirectURIs []string
}

// User is someone who signs in at the provider.
type User struct {
	// Subject is the user's sub claim. It must not be a service client's
	// ID: the tokens of both are told apart by their subject.
	Subject string
	// Claims are added to the user's ID and access tokens (tenant, groups,
	// email, ...).
	Claims map[string]any
}

// Provider is a running OpenID Provider.
type Provider struct {
	// Issuer is the provider's issuer URL.
	Issuer string
	st     *opStorage
	op     *op.Provider
}

// Start serves a provider on a loopback port until the test ends.
func Start(t testing.TB) *Provider {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	st := &opStorage{
		Storage: storage.NewStorage(storage.NewUserStore(issuer)),
		issuer:  issuer,
		clients: map[string]Client{},
		public:  map[string]PublicClient{},
		users:   map[string]User{},
		keys:    []*key{newKey(t)},
	}
	var crypto [32]byte
	_, _ = rand.Read(crypto[:])
	p, err := op.NewProvider(&op.Config{CryptoKey: crypto, AuthMethodPost: true}, st, op.StaticIssuer(issuer),
		op.WithAllowInsecure(), op.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("starting the OpenID Provider: %v", err)
	}
	prov := &Provider{Issuer: issuer, st: st, op: p}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", prov.login)
	mux.Handle("/", p)
	srv.Config.Handler = mux
	srv.Start()
	t.Cleanup(srv.Close)
	return prov
}

// AddPublicClient registers c.
func (p *Provider) AddPublicClient(c PublicClient) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.public[c.ID] = c
}

// SignIn makes u the user the login step signs in from now on, for every
// authorization request.
func (p *Provider) SignIn(u User) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.users[u.Subject] = u
	p.st.signedIn = u.Subject
}

// SignOut leaves nobody signed in: the login step refuses (access_denied).
func (p *Provider) SignOut() {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.signedIn = ""
}

// login is the provider's login step (a public client's LoginURL): it
// completes the authorization request id as the signed-in user and sends
// the browser on to the callback, which issues the code.
func (p *Provider) login(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	req, err := p.st.AuthRequestByID(r.Context(), id)
	if err != nil {
		http.Error(w, "no such authorization request", http.StatusBadRequest)
		return
	}
	p.st.mu.Lock()
	subject := p.st.signedIn
	p.st.mu.Unlock()
	if subject == "" {
		op.AuthRequestError(w, r, req, oidc.ErrAccessDenied().WithDescription("nobody is signed in"), p.op)
		return
	}
	// The example storage's request: its user is set before it is marked
	// done (under the storage's lock), as its own login form does.
	req.(*storage.AuthRequest).UserID = subject
	if err := p.st.AuthRequestDone(id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx := op.ContextWithIssuer(r.Context(), p.Issuer)
	http.Redirect(w, r, op.AuthCallbackURL(p.op)(ctx, id), http.StatusFound)
}

// AuthorizationCode does a browser's part of the authorization-code flow
// for public client id without a browser: it asks the authorization
// endpoint for a code for redirectURI, with the S256 challenge of verifier
// and state "state", goes through the login step as the signed-in user and
// returns the code the provider sends back.
func (p *Provider) AuthorizationCode(t testing.TB, id, redirectURI, verifier string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{
		"response_type": {"code"}, "client_id": {id}, "redirect_uri": {redirectURI}, "scope": {"openid profile email"},
		"state": {"state"}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
	}
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if req.URL.Scheme+"://"+req.URL.Host != p.Issuer {
			return http.ErrUseLastResponse // back at the client: its code
		}
		return nil
	}}
	resp, err := client.Get(p.Issuer + "/authorize?" + q.Encode())
	if err != nil {
		t.Fatalf("authorizing %s: %v", id, err)
	}
	resp.Body.Close()
	back, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.StatusCode != http.StatusFound || back.Query().Get("code") == "" || back.Query().Get("state") != "state" {
		t.Fatalf("authorizing %s: %s to %q", id, resp.Status, resp.Header.Get("Location"))
	}
	return back.Query().Get("code")
}

// AddClient registers c.
func (p *Provider) AddClient(c Client) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.clients[c.ID] = c
}

// Token asks the provider's token endpoint (found through discovery) for a
// token for client id, as any OAuth client would.
func (p *Provider) Token(t testing.TB, id string) string {
	t.Helper()
	p.st.mu.Lock()
	c := p.st.clients[id]
	p.st.mu.Unlock()
	// A plain client-credentials request (RFC 6749 4.4): oauth2 clients
	// refuse the negative expires_in of an already expired token, which
	// this provider issues on purpose.
	form := url.Values{"grant_type": {"client_credentials"}, "scope": {"openid"}}
	req, err := http.NewRequest("POST", p.Issuer+"/oauth/token", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(c.ID), url.QueryEscape(c.Secret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("token for %s: %v", id, err)
	}
	defer resp.Body.Close()
	var body struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.AccessToken == "" {
		t.Fatalf("token for %s: status %d, %v, error %q", id, resp.StatusCode, err, body.Error)
	}
	return body.AccessToken
}

// SignWithUnpublishedKey makes the provider sign with a key its JWKS does
// not list (while on is set): what a forger with its own key produces.
func (p *Provider) SignWithUnpublishedKey(t testing.TB, on bool) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	if on {
		p.st.rogue = newKey(t)
	} else {
		p.st.rogue = nil
	}
}

// RotateKey signs with a new key from now on; the JWKS lists both.
func (p *Provider) RotateKey(t testing.TB) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.keys = append([]*key{newKey(t)}, p.st.keys...)
}

type key struct {
	id  string
	key *rsa.PrivateKey
}

func newKey(t testing.TB) *key {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &key{id: "k" + hexOf(b), key: k}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func (k *key) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *key) Key() any                                    { return k.key }
func (k *key) ID() string                                  { return k.id }

type pubKey struct{ k *key }

func (p pubKey) ID() string                         { return p.k.id }
func (p pubKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (p pubKey) Use() string                        { return "sig" }
func (p pubKey) Key() any                           { return &p.k.key.PublicKey }

// opStorage is zitadel's example storage (the parts a provider needs that
// this test does not use) with clients, keys and claims of our own.
type opStorage struct {
	*storage.Storage
	issuer string

	// mu guards the fields below.
	mu       sync.Mutex
	clients  map[string]Client
	public   map[string]PublicClient
	users    map[string]User // by subject
	signedIn string          // the subject the login step signs in; none when empty
	keys     []*key          // keys[0] signs
	rogue    *key            // when set, signs instead and is not published
}

func (s *opStorage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.public[id]
	if !ok {
		return nil, errors.New("no such client")
	}
	return &publicClient{c: c, issuer: s.issuer}, nil
}

func (s *opStorage) ClientCredentials(_ context.Context, id, secret string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok || c.Secret != secret {
		return nil, errors.New("wrong client or secret")
	}
	return &opClient{c}, nil
}

func (s *opStorage) ClientCredentialsTokenRequest(_ context.Context, id string, scopes []string) (op.TokenRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok {
		return nil, errors.New("wrong client")
	}
	return &oidc.JWTTokenRequest{Subject: c.ID, Audience: c.Audience, Scopes: scopes}, nil
}

func (s *opStorage) CreateAccessToken(_ context.Context, req op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	life := s.clients[req.GetSubject()].Lifetime
	if life == 0 {
		life = 5 * time.Minute
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hexOf(b), time.Now().Add(life), nil
}

func (s *opStorage) GetPrivateClaimsFromScopes(_ context.Context, subject, _ string, _ []string) (map[string]any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.users[subject]; ok {
		return u.Claims, nil
	}
	return s.clients[subject].Claims, nil
}

// SetUserinfoFromRequest fills a user's ID token: its subject and claims,
// whatever the scopes.
func (s *opStorage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, req op.IDTokenRequest, _ []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.users[req.GetSubject()]
	if !ok {
		return errors.New("no such user")
	}
	info.Subject = u.Subject
	for k, v := range u.Claims {
		info.AppendClaims(k, v)
	}
	return nil
}

func (s *opStorage) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rogue != nil {
		return s.rogue, nil
	}
	return s.keys[0], nil
}

func (s *opStorage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *opStorage) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []op.Key
	for _, k := range s.keys {
		out = append(out, pubKey{k})
	}
	return out, nil
}

// opClient is a confidential service client using JWT access tokens.
type opClient struct{ c Client }

func (c *opClient) GetID() string                       { return c.c.ID }
func (c *opClient) RedirectURIs() []string              { return nil }
func (c *opClient) PostLogoutRedirectURIs() []string    { return nil }
func (c *opClient) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c *opClient) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodBasic }
func (c *opClient) ResponseTypes() []oidc.ResponseType  { return nil }
func (c *opClient) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeClientCredentials}
}
func (c *opClient) LoginURL(string) string               { return "" }
func (c *opClient) AccessTokenType() op.AccessTokenType  { return op.AccessTokenTypeJWT }
func (c *opClient) IDTokenLifetime() time.Duration       { return 5 * time.Minute }
func (c *opClient) DevMode() bool                        { return false }
func (c *opClient) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *opClient) ClockSkew() time.Duration             { return 0 }
func (c *opClient) IsScopeAllowed(string) bool           { return true }
func (c *opClient) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *opClient) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

// publicClient is a browser's client: the authorization-code grant with
// PKCE and no secret, JWT access tokens.
type publicClient struct {
	c      PublicClient
	issuer string
}

func (c *publicClient) GetID() string                       { return c.c.ID }
func (c *publicClient) RedirectURIs() []string              { return c.c.RedirectURIs }
func (c *publicClient) PostLogoutRedirectURIs() []string    { return nil }
func (c *publicClient) ApplicationType() op.ApplicationType { return op.ApplicationTypeUserAgent }
func (c *publicClient) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodNone }
func (c *publicClient) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *publicClient) GrantTypes() []oidc.GrantType { return []oidc.GrantType{oidc.GrantTypeCode} }
func (c *publicClient) LoginURL(id string) string {
	return c.issuer + "/login?id=" + url.QueryEscape(id)
}
func (c *publicClient) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (c *publicClient) IDTokenLifetime() time.Duration      { return 5 * time.Minute }

// DevMode lets the client's redirect URIs be http (loopback in tests).
func (c *publicClient) DevMode() bool                        { return true }
func (c *publicClient) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *publicClient) ClockSkew() time.Duration             { return 0 }
func (c *publicClient) IsScopeAllowed(string) bool           { return true }
func (c *publicClient) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *publicClient) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
