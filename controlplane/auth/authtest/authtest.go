// Package authtest serves a real OpenID Provider inside a test: zitadel's
// certified op package with discovery, a JWKS endpoint and a token endpoint
// for the client-credentials grant, over in-memory clients the test
// registers. Tokens are what any provider issues (JWT access tokens signed
// with the provider's key); the test controls audience, lifetime, claims and
// which key signs.
package authtest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
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

// Provider is a running OpenID Provider.
type Provider struct {
	// Issuer is the provider's issuer URL.
	Issuer string
	st     *opStorage
}

// Start serves a provider on a loopback port until the test ends.
func Start(t testing.TB) *Provider {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	st := &opStorage{
		Storage: storage.NewStorage(storage.NewUserStore(issuer)),
		clients: map[string]Client{},
		keys:    []*key{newKey(t)},
	}
	var crypto [32]byte
	_, _ = rand.Read(crypto[:])
	p, err := op.NewProvider(&op.Config{CryptoKey: crypto, AuthMethodPost: true}, st, op.StaticIssuer(issuer),
		op.WithAllowInsecure(), op.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("starting the OpenID Provider: %v", err)
	}
	srv.Config.Handler = p
	srv.Start()
	t.Cleanup(srv.Close)
	return &Provider{Issuer: issuer, st: st}
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

	// mu guards the fields below.
	mu      sync.Mutex
	clients map[string]Client
	keys    []*key // keys[0] signs
	rogue   *key   // when set, signs instead and is not published
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
	return s.clients[subject].Claims, nil
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
