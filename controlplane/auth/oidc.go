package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/coreos/go-oidc/v3/oidc"
	"gopkg.in/yaml.v3"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/policy"
)

// IssuerConfig is one OpenID Provider whose tokens corral accepts.
type IssuerConfig struct {
	// Issuer is the provider's issuer URL; its discovery document is at
	// <Issuer>/.well-known/openid-configuration.
	Issuer string `yaml:"issuer"`
	// Audience must appear in a token's aud claim.
	Audience string `yaml:"audience"`
	// Tenant, when set, is the tenant of every token of this issuer (one
	// issuer per tenant). Otherwise TenantClaim names the claim that
	// carries the tenant id (one issuer shared by tenants).
	Tenant      tenant.ID `yaml:"tenant"`
	TenantClaim string    `yaml:"tenant_claim"`
	// GroupsClaim names the claim listing the caller's groups; default
	// "groups". GroupRoles maps a group to tenant roles (policy/roles.yaml);
	// Roles are given to every token of this issuer.
	GroupsClaim string              `yaml:"groups_claim"`
	GroupRoles  map[string][]string `yaml:"group_roles"`
	Roles       []string            `yaml:"roles"`
	// ConsoleClientID, when set, offers this issuer on the web console's
	// sign-in form: the console runs the authorization-code flow with PKCE
	// (RFC 7636) as this public client, which has no secret, with the
	// redirect URI <console origin>/console/. ConsoleScopes is the
	// space-separated scopes it asks for (DefaultConsoleScopes when empty;
	// openid among them); ConsoleName labels the button (the issuer's host
	// when empty). The tokens it gets are checked as any other, so the
	// provider must issue this client tokens whose audience is Audience.
	ConsoleClientID string `yaml:"console_client_id"`
	ConsoleScopes   string `yaml:"console_scopes"`
	ConsoleName     string `yaml:"console_name"`
}

// DefaultConsoleScopes are the scopes the console asks an issuer for when
// its configuration names none.
const DefaultConsoleScopes = "openid profile email"

// Bounds on the console client's settings: they reach every browser that
// opens the console, and the provider's URLs.
const (
	maxConsoleClientID = 255
	maxConsoleScopes   = 1024
	maxConsoleName     = 64
)

// Scopes is the space-separated scopes the console asks the issuer for.
func (c IssuerConfig) Scopes() string {
	if c.ConsoleScopes == "" {
		return DefaultConsoleScopes
	}
	return c.ConsoleScopes
}

// ConsoleLabel names the issuer on the console's sign-in button.
func (c IssuerConfig) ConsoleLabel() string {
	if c.ConsoleName != "" {
		return c.ConsoleName
	}
	if u, err := url.Parse(c.Issuer); err == nil && u.Host != "" {
		return u.Host
	}
	return c.Issuer
}

// LoadIssuers reads a YAML file of the form {issuers: [IssuerConfig...]}.
func LoadIssuers(path string) ([]IssuerConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.InvalidArgument("oidc config: %v", err)
	}
	var f struct {
		Issuers []IssuerConfig `yaml:"issuers"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, errdefs.InvalidArgument("oidc config %s: %v", path, err)
	}
	return f.Issuers, nil
}

// Validate reports the first problem with c: a missing issuer or audience,
// no way to find the tenant, or a role the policy lacks or that is not a
// tenant role.
func (c IssuerConfig) Validate(p *policy.Policy) error {
	switch {
	case c.Issuer == "" || !(strings.HasPrefix(c.Issuer, "https://") || strings.HasPrefix(c.Issuer, "http://")):
		return errdefs.InvalidArgument("oidc issuer %q: want an http(s) URL", c.Issuer)
	case c.Audience == "":
		return errdefs.InvalidArgument("oidc issuer %s: audience is required", c.Issuer)
	case (c.Tenant == "") == (c.TenantClaim == ""):
		return errdefs.InvalidArgument("oidc issuer %s: set exactly one of tenant and tenant_claim", c.Issuer)
	}
	if c.Tenant != "" {
		if err := c.Tenant.Validate(); err != nil {
			return errdefs.InvalidArgument("oidc issuer %s: %v", c.Issuer, err)
		}
	}
	if err := c.validateConsole(); err != nil {
		return err
	}
	roles := slices.Clone(c.Roles)
	for _, rs := range c.GroupRoles {
		roles = append(roles, rs...)
	}
	for _, r := range roles {
		scope, ok := p.HasRole(r)
		if !ok {
			return errdefs.InvalidArgument("oidc issuer %s: unknown role %q", c.Issuer, r)
		}
		if scope != policy.TenantScope {
			return errdefs.InvalidArgument("oidc issuer %s: role %s is not a tenant role", c.Issuer, r)
		}
	}
	return nil
}

// validateConsole checks the console client's settings: a client id and
// scopes that are OAuth tokens (RFC 6749 A.1, 3.3), openid among the scopes,
// and a name that is plain text.
func (c IssuerConfig) validateConsole() error {
	if c.ConsoleClientID == "" {
		if c.ConsoleScopes != "" || c.ConsoleName != "" {
			return errdefs.InvalidArgument("oidc issuer %s: console_scopes and console_name need a console_client_id", c.Issuer)
		}
		return nil
	}
	if len(c.ConsoleClientID) > maxConsoleClientID || strings.ContainsFunc(c.ConsoleClientID, func(r rune) bool { return r <= 0x20 || r > 0x7e }) {
		return errdefs.InvalidArgument("oidc issuer %s: console_client_id must be at most %d printable ASCII characters, no spaces", c.Issuer, maxConsoleClientID)
	}
	scopes := strings.Split(c.Scopes(), " ")
	if len(c.ConsoleScopes) > maxConsoleScopes || slices.ContainsFunc(scopes, func(s string) bool { return !scopeToken(s) }) {
		return errdefs.InvalidArgument("oidc issuer %s: console_scopes must be at most %d characters of scopes separated by single spaces", c.Issuer, maxConsoleScopes)
	}
	if !slices.Contains(scopes, "openid") {
		return errdefs.InvalidArgument("oidc issuer %s: console_scopes must include openid", c.Issuer)
	}
	if len(c.ConsoleName) > maxConsoleName || strings.ContainsFunc(c.ConsoleName, unicode.IsControl) {
		return errdefs.InvalidArgument("oidc issuer %s: console_name must be at most %d characters of text", c.Issuer, maxConsoleName)
	}
	return nil
}

// scopeToken reports whether s is one scope: %x21 / %x23-5B / %x5D-7E.
func scopeToken(s string) bool {
	if s == "" {
		return false
	}
	for _, b := range []byte(s) {
		if b < 0x21 || b > 0x7e || b == '"' || b == '\\' {
			return false
		}
	}
	return true
}

// issuer verifies one provider's tokens. Discovery happens on first use and
// is retried on later requests until it succeeds; go-oidc's key set
// refetches the provider's JWKS when a token names a key id it does not
// know, which handles key rotation.
type issuer struct {
	cfg    IssuerConfig
	client *http.Client
	now    func() time.Time

	// mu guards verifier, endpoints, failedAt and failure.
	mu        sync.Mutex
	verifier  *oidc.IDTokenVerifier
	endpoints Endpoints
	failedAt  time.Time
	failure   error
}

// Endpoints are where a provider's OAuth flows go, from its discovery
// document.
type Endpoints struct {
	// Authorization is where a browser is sent to sign in
	// (authorization_endpoint); Token is where a code is exchanged for
	// tokens (token_endpoint). Either may be empty: a provider that only
	// issues tokens to services publishes no authorization endpoint.
	Authorization, Token string
}

// discoveryRetry is how long a failed discovery is reported before it is
// tried again, so that requests do not queue behind an unreachable provider.
const discoveryRetry = 5 * time.Second

func (i *issuer) get(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	if err := i.discover(ctx); err != nil {
		return nil, err
	}
	return i.verifier, nil
}

// discover reads the provider's discovery document once it succeeds,
// remembering a failure for discoveryRetry.
func (i *issuer) discover(ctx context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.verifier != nil {
		return nil
	}
	if i.failure != nil && i.now().Sub(i.failedAt) < discoveryRetry {
		return i.failure
	}
	// The key set keeps this context for its fetches: no deadline on it.
	pctx := oidc.ClientContext(context.WithoutCancel(ctx), i.client)
	p, err := oidc.NewProvider(pctx, i.cfg.Issuer)
	if err != nil {
		i.failedAt, i.failure = i.now(), errdefs.Wrap(errdefs.UnavailableKind, err, "oidc discovery for %s", i.cfg.Issuer)
		return i.failure
	}
	i.verifier = p.Verifier(&oidc.Config{ClientID: i.cfg.Audience, Now: i.now})
	e := p.Endpoint()
	// Browsers are sent to the one and sign-in codes to the other: only
	// web URLs, whatever the document says.
	if webURL(e.AuthURL) {
		i.endpoints.Authorization = e.AuthURL
	}
	if webURL(e.TokenURL) {
		i.endpoints.Token = e.TokenURL
	}
	return nil
}

func webURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" && u.User == nil
}

// ConsoleIssuers returns the configurations of the issuers that have a
// console client, in the order they were configured.
func (a *Authenticator) ConsoleIssuers() []IssuerConfig {
	return slices.Clone(a.consoles)
}

// Endpoints returns the OAuth endpoints of issuer iss, reading its
// discovery document if this node has not yet: not found for an issuer
// this server does not trust, unavailable while the provider cannot be
// reached.
func (a *Authenticator) Endpoints(ctx context.Context, iss string) (Endpoints, error) {
	is, ok := a.issuers[iss]
	if !ok {
		return Endpoints{}, errdefs.NotFound("oidc issuer %q is not one this server trusts", iss)
	}
	if err := is.discover(ctx); err != nil {
		return Endpoints{}, err
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.endpoints, nil
}

func (a *Authenticator) token(ctx context.Context, raw logging.Secret) (Principal, error) {
	s := raw.Reveal()
	if len(s) > MaxCredentialBytes {
		return Principal{}, errdefs.Unauthenticated("credential longer than %d bytes", MaxCredentialBytes)
	}
	iss, err := unverifiedIssuer(s)
	if err != nil {
		return Principal{}, err
	}
	is, ok := a.issuers[iss]
	if !ok {
		return Principal{}, errdefs.Unauthenticated("token from an issuer this server does not trust")
	}
	v, err := is.get(ctx)
	if err != nil {
		return Principal{}, err
	}
	tok, err := v.Verify(ctx, s)
	if err != nil {
		return Principal{}, errdefs.Unauthenticated("invalid token: %v", err)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return Principal{}, errdefs.Unauthenticated("invalid token claims")
	}
	tid := is.cfg.Tenant
	if tid == "" {
		v, _ := claims[is.cfg.TenantClaim].(string)
		tid = tenant.ID(v)
		if tid.Validate() != nil {
			return Principal{}, errdefs.Unauthenticated("token's %s claim names no valid tenant", is.cfg.TenantClaim)
		}
	}
	t, err := a.tenants.Get(ctx, tid)
	if errdefs.IsNotFound(err) {
		return Principal{}, errdefs.Unauthenticated("token's tenant %s does not exist", tid)
	}
	if err != nil {
		return Principal{}, err
	}
	if t.Status != "active" {
		return Principal{}, errdefs.PermissionDenied("tenant %s is suspended", tid)
	}
	p := Principal{
		Subject: iss + "#" + tok.Subject,
		Tenant:  tid,
		Roles:   is.roles(claims),
		Method:  MethodOIDC,
	}
	if a.users == nil {
		return p, nil
	}
	u, err := a.user(ctx, userKey{tid, iss, tok.Subject}, displayName(claims))
	if err != nil {
		return Principal{}, err
	}
	if u.Disabled() {
		return Principal{}, errdefs.Unauthenticated("user %s is disabled", u.ID)
	}
	p.PrincipalID, p.Subject = u.ID, subject(u.Kind+":"+u.Name, u.ID)
	for _, r := range u.Roles {
		if !slices.Contains(p.Roles, r) {
			p.Roles = append(p.Roles, r)
		}
	}
	return p, nil
}

// user returns the record of the user k, made on first sight. A node
// trusts what it learnt for keyCacheTTL, as it does for keys.
func (a *Authenticator) user(ctx context.Context, k userKey, name string) (store.Principal, error) {
	now := a.now()
	a.mu.Lock()
	c, ok := a.seen[k]
	a.mu.Unlock()
	if ok && now.Sub(c.at) < keyCacheTTL {
		return c.p, nil
	}
	u, err := a.users.SeenUser(tenant.With(ctx, k.tenant), k.issuer, k.subject, name)
	if errdefs.IsInvalidArgument(err) {
		return store.Principal{}, errdefs.Unauthenticated("token's subject cannot name a user: %v", err)
	}
	if err != nil {
		return store.Principal{}, errdefs.Wrap(errdefs.UnavailableKind, err, "recording user %s", k.subject)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) >= 10000 {
		clear(a.seen)
	}
	a.seen[k] = cachedUser{p: u, at: now}
	return u, nil
}

// displayName is how a user is named on its record, from the first of the
// token's claims that has a usable one; the subject when none does.
func displayName(claims map[string]any) string {
	for _, c := range []string{"email", "preferred_username", "name"} {
		if v, ok := claims[c].(string); ok && v != "" && len(v) <= 255 && !strings.ContainsFunc(v, unicode.IsControl) {
			return v
		}
	}
	return ""
}

// roles maps the token's groups to roles, adding the issuer's fixed roles.
func (i *issuer) roles(claims map[string]any) []string {
	roles := slices.Clone(i.cfg.Roles)
	name := i.cfg.GroupsClaim
	if name == "" {
		name = "groups"
	}
	var groups []string
	switch g := claims[name].(type) {
	case string:
		groups = []string{g}
	case []any:
		for _, v := range g {
			if s, ok := v.(string); ok {
				groups = append(groups, s)
			}
		}
	}
	for _, g := range groups {
		for _, r := range i.cfg.GroupRoles[g] {
			if !slices.Contains(roles, r) {
				roles = append(roles, r)
			}
		}
	}
	return roles
}

// unverifiedIssuer reads the iss claim of a JWT without verifying it, only
// to pick the issuer that verifies it next.
func unverifiedIssuer(tok string) (string, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", errdefs.Unauthenticated("malformed token: not an API key and not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", errdefs.Unauthenticated("malformed token: payload is not base64url")
	}
	var c struct {
		Iss string `json:"iss"`
	}
	if err := json.Unmarshal(payload, &c); err != nil || c.Iss == "" {
		return "", errdefs.Unauthenticated("malformed token: no issuer")
	}
	return c.Iss, nil
}

// Trusts reports whether tokens of issuer iss are accepted here.
func (a *Authenticator) Trusts(iss string) bool {
	_, ok := a.issuers[iss]
	return ok
}
