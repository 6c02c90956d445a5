package auth

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/auth/authtest"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/policy"
)

type keys struct {
	mu      sync.Mutex
	ki      store.KeyIdentity
	err     error
	lookups int
	touches int
}

func (k *keys) Authenticate(context.Context, logging.Secret) (store.KeyIdentity, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lookups++
	return k.ki, k.err
}

func (k *keys) Touch(context.Context, tenant.ID, string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.touches++
	return nil
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

const secret = logging.Secret("sk-corral-abcdefABCDEF0123456789_-")

func setup(t *testing.T) (*Authenticator, *keys, *clock) {
	t.Helper()
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	k := &keys{ki: store.KeyIdentity{TenantID: "tenant_a", KeyID: "key_1", Principal: "key:ci", Roles: []string{"admin"}}}
	c := &clock{t: time.Unix(1_000_000, 0)}
	a, err := New(Config{Keys: k, Policy: p, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return a, k, c
}

func TestKeyCacheAndTouch(t *testing.T) {
	a, k, c := setup(t)
	ctx := context.Background()
	for range 3 {
		p, err := a.Authenticate(ctx, Credentials{APIKey: secret})
		if err != nil || p.Tenant != "tenant_a" || p.Subject != "key:ci" || p.Method != MethodAPIKey {
			t.Fatalf("Authenticate = %+v, %v", p, err)
		}
	}
	if k.lookups != 1 || k.touches != 1 {
		t.Fatalf("3 requests: %d lookups, %d touches; want 1 and 1", k.lookups, k.touches)
	}
	c.t = c.t.Add(keyCacheTTL)
	k.ki.LastUsedAt = c.t.Add(-time.Second) // another node touched it just now
	if _, err := a.Authenticate(ctx, Credentials{Bearer: secret}); err != nil {
		t.Fatal(err)
	}
	if k.lookups != 2 || k.touches != 1 {
		t.Fatalf("after the cache period: %d lookups, %d touches; want 2 and 1", k.lookups, k.touches)
	}
	c.t = c.t.Add(touchEvery + keyCacheTTL)
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); err != nil || k.touches != 2 {
		t.Fatalf("a minute later: %d touches, %v", k.touches, err)
	}

	// Revoked through this node: Forget applies it at once.
	k.ki.Revoked = true
	a.Forget()
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("revoked: %v", err)
	}
	k.ki.Revoked, k.ki.Disabled = false, true
	a.Forget()
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("principal disabled: %v", err)
	}
	k.ki.Disabled, k.ki.Suspended = false, true
	a.Forget()
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); errdefs.KindOf(err) != errdefs.PermissionDeniedKind {
		t.Fatalf("suspended: %v", err)
	}
}

// A tenant key names its principal record in the audit log.
func TestKeySubjectNamesItsPrincipal(t *testing.T) {
	a, k, _ := setup(t)
	k.ki.PrincipalID, k.ki.Principal = "prn_1", "service:ci"
	p, err := a.Authenticate(context.Background(), Credentials{APIKey: secret})
	if err != nil || p.PrincipalID != "prn_1" || p.Subject != "service:ci (prn_1)" {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
}

// A bad key repeated costs one lookup per cache period.
func TestUnknownKeyIsRemembered(t *testing.T) {
	a, k, c := setup(t)
	k.err = errdefs.NotFound("no such key")
	for range 5 {
		if _, err := a.Authenticate(context.Background(), Credentials{APIKey: secret}); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
			t.Fatalf("unknown key: %v", err)
		}
	}
	if k.lookups != 1 {
		t.Fatalf("%d lookups for 5 requests with the same unknown key", k.lookups)
	}
	c.t = c.t.Add(keyCacheTTL)
	_, _ = a.Authenticate(context.Background(), Credentials{APIKey: secret})
	if k.lookups != 2 {
		t.Fatalf("%d lookups after the cache period", k.lookups)
	}
}

// While the database is away, a key this node knew keeps working for a
// while; an unknown key does not.
func TestDatabaseAway(t *testing.T) {
	a, k, c := setup(t)
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); err != nil {
		t.Fatal(err)
	}
	k.err = errdefs.Unavailable("database")
	c.t = c.t.Add(keyCacheTTL + time.Minute)
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); err != nil {
		t.Fatalf("known key, database away: %v", err)
	}
	c.t = c.t.Add(staleKeyTTL)
	if _, err := a.Authenticate(ctx, Credentials{APIKey: secret}); !errdefs.IsUnavailable(err) {
		t.Fatalf("known key long ago, database away: %v", err)
	}
	if _, err := a.Authenticate(ctx, Credentials{APIKey: "sk-corral-other"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("unknown key, database away: %v", err)
	}
}

func TestIssuerConfigValidate(t *testing.T) {
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	good := IssuerConfig{Issuer: "https://idp", Audience: "corral", TenantClaim: "org", GroupRoles: map[string][]string{"eng": {"developer"}}}
	if err := good.Validate(p); err != nil {
		t.Fatal(err)
	}
	tests := map[string]func(*IssuerConfig){
		"no issuer":                       func(c *IssuerConfig) { c.Issuer = "" },
		"not a url":                       func(c *IssuerConfig) { c.Issuer = "idp.example" },
		"no audience":                     func(c *IssuerConfig) { c.Audience = "" },
		"no tenant":                       func(c *IssuerConfig) { c.TenantClaim = "" },
		"both tenant kinds":               func(c *IssuerConfig) { c.Tenant = "tenant_a" },
		"bad fixed tenant":                func(c *IssuerConfig) { c.TenantClaim, c.Tenant = "", "acme" },
		"unknown role":                    func(c *IssuerConfig) { c.GroupRoles = map[string][]string{"eng": {"superuser"}} },
		"fleet role":                      func(c *IssuerConfig) { c.Roles = []string{"operator"} },
		"console scopes without a client": func(c *IssuerConfig) { c.ConsoleScopes = "openid" },
		"console name without a client":   func(c *IssuerConfig) { c.ConsoleName = "Acme" },
		"console client id with a space":  func(c *IssuerConfig) { c.ConsoleClientID = "corral console" },
		"console client id too long":      func(c *IssuerConfig) { c.ConsoleClientID = strings.Repeat("c", 256) },
		"console scopes without openid":   func(c *IssuerConfig) { c.ConsoleClientID, c.ConsoleScopes = "console", "profile email" },
		"console scopes doubly spaced":    func(c *IssuerConfig) { c.ConsoleClientID, c.ConsoleScopes = "console", "openid  email" },
		"console scope with a quote":      func(c *IssuerConfig) { c.ConsoleClientID, c.ConsoleScopes = "console", `openid e"mail` },
		"console name with a newline":     func(c *IssuerConfig) { c.ConsoleClientID, c.ConsoleName = "console", "Acme\nSSO" },
		"console name too long":           func(c *IssuerConfig) { c.ConsoleClientID, c.ConsoleName = "console", strings.Repeat("n", 65) },
	}
	for name, mutate := range tests {
		c := good
		mutate(&c)
		if err := c.Validate(p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	if _, err := New(Config{Policy: p, Issuers: []IssuerConfig{good, good}}); err == nil {
		t.Error("the same issuer twice was accepted")
	}
	console := good
	console.ConsoleClientID, console.ConsoleScopes, console.ConsoleName = "corral-console", "openid groups", "Acme SSO"
	if err := console.Validate(p); err != nil {
		t.Errorf("a console client: %v", err)
	}
}

// The console client's settings are read from the YAML file.
func TestLoadIssuersWithAConsoleClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "issuers.yaml")
	if err := os.WriteFile(path, []byte(`issuers:
  - issuer: https://login.example.com
    audience: corral-console
    tenant_claim: org
    console_client_id: corral-console
    console_name: Acme SSO
    console_scopes: openid groups
`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadIssuers(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ConsoleClientID != "corral-console" || got[0].ConsoleName != "Acme SSO" || got[0].ConsoleScopes != "openid groups" {
		t.Errorf("loaded %+v", got)
	}
}

// The console's button and scopes fall back to the issuer's host and the
// default scopes.
func TestConsoleDefaults(t *testing.T) {
	c := IssuerConfig{Issuer: "https://login.example.com:8443/realms/acme", ConsoleClientID: "console"}
	if c.ConsoleLabel() != "login.example.com:8443" || c.Scopes() != DefaultConsoleScopes {
		t.Errorf("label %q, scopes %q", c.ConsoleLabel(), c.Scopes())
	}
	c.ConsoleName, c.ConsoleScopes = "Acme", "openid"
	if c.ConsoleLabel() != "Acme" || c.Scopes() != "openid" {
		t.Errorf("label %q, scopes %q", c.ConsoleLabel(), c.Scopes())
	}
}

// The issuers with a console client are listed in configuration order;
// their endpoints come from the provider's discovery document, and only
// configured issuers have any.
func TestConsoleIssuersAndEndpoints(t *testing.T) {
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	op := authtest.Start(t)
	a, err := New(Config{Policy: p, Issuers: []IssuerConfig{
		{Issuer: "https://second.example", Audience: "corral", Tenant: "tenant_a", ConsoleClientID: "b"},
		{Issuer: "https://no-console.example", Audience: "corral", Tenant: "tenant_a"},
		{Issuer: op.Issuer, Audience: "corral", Tenant: "tenant_a", ConsoleClientID: "a"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range a.ConsoleIssuers() {
		ids = append(ids, c.ConsoleClientID)
	}
	if strings.Join(ids, ",") != "b,a" {
		t.Errorf("console issuers %v", ids)
	}
	e, err := a.Endpoints(context.Background(), op.Issuer)
	if err != nil {
		t.Fatal(err)
	}
	if e.Authorization != op.Issuer+"/authorize" || e.Token != op.Issuer+"/oauth/token" {
		t.Errorf("endpoints %+v", e)
	}
	if _, err := a.Endpoints(context.Background(), op.Issuer+"/"); !errdefs.IsNotFound(err) {
		t.Errorf("an issuer not configured (a slash added): %v", err)
	}
}

func TestGroupsToRoles(t *testing.T) {
	is := &issuer{cfg: IssuerConfig{Roles: []string{"viewer"}, GroupRoles: map[string][]string{"eng": {"developer"}, "ops": {"admin", "developer"}}}}
	for name, tt := range map[string]struct {
		claims map[string]any
		want   []string
	}{
		"list":   {map[string]any{"groups": []any{"eng", "ops", "sales", 7}}, []string{"viewer", "developer", "admin"}},
		"string": {map[string]any{"groups": "ops"}, []string{"viewer", "admin", "developer"}},
		"none":   {map[string]any{}, []string{"viewer"}},
	} {
		got := is.roles(tt.claims)
		if len(got) != len(tt.want) {
			t.Errorf("%s: roles = %v, want %v", name, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: roles = %v, want %v", name, got, tt.want)
			}
		}
	}
}

// An unreachable provider answers 503 without queueing every request
// behind a new discovery attempt; it is tried again after a while.
func TestDiscoveryFailureIsRemembered(t *testing.T) {
	p, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		http.Error(w, "down", http.StatusBadGateway)
	}))
	defer srv.Close()
	c := &clock{t: time.Unix(1_000_000, 0)}
	a, err := New(Config{Policy: p, Now: c.now, Issuers: []IssuerConfig{{Issuer: srv.URL, Audience: "corral", Tenant: "tenant_a"}}})
	if err != nil {
		t.Fatal(err)
	}
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"` + srv.URL + `"}`))
	tok := logging.Secret("eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln")
	for range 3 {
		if _, err := a.Authenticate(context.Background(), Credentials{Bearer: tok}); !errdefs.IsUnavailable(err) {
			t.Fatalf("provider down: %v", err)
		}
	}
	if hits != 1 {
		t.Fatalf("%d discovery attempts for 3 requests", hits)
	}
	c.t = c.t.Add(discoveryRetry)
	_, _ = a.Authenticate(context.Background(), Credentials{Bearer: tok})
	if hits != 2 {
		t.Fatalf("%d discovery attempts after the retry period", hits)
	}
}

// A user's record is named from the first usable claim; the store names it
// after its subject when none is.
func TestDisplayName(t *testing.T) {
	long := strings.Repeat("x", 256)
	for _, c := range []struct {
		claims map[string]any
		want   string
	}{
		{map[string]any{"email": "a@x", "preferred_username": "a", "name": "A"}, "a@x"},
		{map[string]any{"email": "a\n@x", "preferred_username": "a"}, "a"},
		{map[string]any{"email": long, "name": "A"}, "A"},
		{map[string]any{"email": 7, "name": ""}, ""},
		{map[string]any{}, ""},
	} {
		if got := displayName(c.claims); got != c.want {
			t.Errorf("displayName(%v) = %q, want %q", c.claims, got, c.want)
		}
	}
}
