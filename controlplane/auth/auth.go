package auth

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/policy"
)

// MaxCredentialBytes bounds a credential. Longer ones are refused before
// any parsing.
const MaxCredentialBytes = 8 << 10

// keyCacheTTL is how long a node trusts what it learnt of an API key. A key
// revoked (or a tenant suspended or deleted) through another node stops
// working here within this time; through this node, at once (Forget).
const keyCacheTTL = 10 * time.Second

// staleKeyTTL is how long a node keeps using what it knew of a key while
// the database cannot be reached.
const staleKeyTTL = 10 * time.Minute

// touchEvery is how often a key's last-used time is recorded at most.
const touchEvery = time.Minute

// KeyStore authenticates API keys. store.APIKeys implements it.
type KeyStore interface {
	// Authenticate returns the key with this secret, or a not found.
	Authenticate(ctx context.Context, secret logging.Secret) (store.KeyIdentity, error)
	// Touch records that the key was used.
	Touch(ctx context.Context, tid tenant.ID, keyID string) error
}

// UserStore records the users that tokens name. store.Principals
// implements it.
type UserStore interface {
	// SeenUser returns the user of the tenant in ctx with this issuer and
	// subject, adding it on first sight.
	SeenUser(ctx context.Context, issuer, subject, name string) (store.Principal, error)
}

// TenantLookup finds a tenant, for tokens that name one. store.Tenants
// implements it.
type TenantLookup interface {
	// Get returns tenant id, or a not found.
	Get(ctx context.Context, id tenant.ID) (store.Tenant, error)
}

// Config configures an Authenticator.
type Config struct {
	Keys    KeyStore
	Tenants TenantLookup
	Users   UserStore
	Policy  *policy.Policy
	// Issuers are the OpenID Providers whose tokens are accepted.
	Issuers []IssuerConfig
	// HTTPClient fetches discovery documents and key sets; default
	// http.DefaultClient with a 10s timeout.
	HTTPClient *http.Client
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Authenticator turns credentials into principals.
type Authenticator struct {
	keys    KeyStore
	tenants TenantLookup
	users   UserStore
	issuers map[string]*issuer // by issuer URL
	// consoles are the issuers with a console client, in configuration
	// order.
	consoles []IssuerConfig
	now      func() time.Time
	log      *slog.Logger

	// mu guards cache, touched and seen.
	mu      sync.Mutex
	cache   map[[32]byte]cachedKey
	touched map[string]time.Time // key id -> when this node last recorded its use
	seen    map[userKey]cachedUser
}

// userKey names a user across tenants.
type userKey struct {
	tenant          tenant.ID
	issuer, subject string
}

type cachedUser struct {
	p  store.Principal
	at time.Time
}

type cachedKey struct {
	ki store.KeyIdentity
	at time.Time
	// unknown records that the database knows no such key, so that a
	// client repeating a bad key costs one lookup per period, not one per
	// request.
	unknown bool
}

// New returns an Authenticator. Issuer configurations are checked against
// the policy (their roles must exist and be tenant roles).
func New(cfg Config) (*Authenticator, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	a := &Authenticator{
		keys: cfg.Keys, tenants: cfg.Tenants, users: cfg.Users, now: cfg.Now, log: cfg.Logger,
		issuers: map[string]*issuer{},
		cache:   map[[32]byte]cachedKey{},
		touched: map[string]time.Time{},
		seen:    map[userKey]cachedUser{},
	}
	for _, ic := range cfg.Issuers {
		if err := ic.Validate(cfg.Policy); err != nil {
			return nil, err
		}
		if _, dup := a.issuers[ic.Issuer]; dup {
			return nil, errdefs.InvalidArgument("oidc issuer %s configured twice", ic.Issuer)
		}
		a.issuers[ic.Issuer] = &issuer{cfg: ic, client: cfg.HTTPClient, now: cfg.Now}
		if ic.ConsoleClientID != "" {
			a.consoles = append(a.consoles, ic)
		}
	}
	return a, nil
}

// Credentials are what a request presented.
type Credentials struct {
	APIKey logging.Secret // x-api-key
	Bearer logging.Secret // Authorization: Bearer
	// Malformed is set when an Authorization header is present but is not a
	// bearer credential.
	Malformed bool
}

// FromHeader reads credentials from HTTP headers.
func FromHeader(h http.Header) Credentials {
	return credentials(h.Get("X-Api-Key"), h.Get("Authorization"))
}

// FromMetadata reads credentials from gRPC metadata (the gateway forwards
// both headers).
func FromMetadata(md metadata.MD) Credentials {
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return credentials(first("x-api-key"), first("authorization"))
}

func credentials(apiKey, authorization string) Credentials {
	c := Credentials{APIKey: logging.Secret(strings.TrimSpace(apiKey))}
	if authorization != "" {
		scheme, rest, ok := strings.Cut(authorization, " ")
		if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(rest) == "" {
			c.Malformed = true
		} else {
			c.Bearer = logging.Secret(strings.TrimSpace(rest))
		}
	}
	return c
}

// Authenticate returns the principal c proves, or an error of kind
// unauthenticated (no, malformed, unknown, revoked or expired credentials),
// permission denied (a suspended tenant) or unavailable.
func (a *Authenticator) Authenticate(ctx context.Context, c Credentials) (Principal, error) {
	switch {
	case c.APIKey != "":
		return a.apiKey(ctx, c.APIKey)
	case c.Malformed:
		return Principal{}, errdefs.Unauthenticated("the Authorization header must be \"Bearer <API key or token>\"")
	case c.Bearer == "":
		return Principal{}, errdefs.Unauthenticated("no credentials: send an API key in x-api-key or a token in Authorization: Bearer")
	case strings.HasPrefix(c.Bearer.Reveal(), store.APIKeyPrefix):
		return a.apiKey(ctx, c.Bearer)
	}
	return a.token(ctx, c.Bearer)
}

func (a *Authenticator) apiKey(ctx context.Context, secret logging.Secret) (Principal, error) {
	s := secret.Reveal()
	if len(s) > MaxCredentialBytes {
		return Principal{}, errdefs.Unauthenticated("credential longer than %d bytes", MaxCredentialBytes)
	}
	if !strings.HasPrefix(s, store.APIKeyPrefix) || !base64URL(s[len(store.APIKeyPrefix):]) {
		return Principal{}, errdefs.Unauthenticated("malformed API key: corral's keys start with %s", store.APIKeyPrefix)
	}
	ki, err := a.lookupKey(ctx, secret)
	if errdefs.IsNotFound(err) {
		return Principal{}, errdefs.Unauthenticated("invalid API key")
	}
	if err != nil {
		return Principal{}, err
	}
	if ki.Revoked {
		return Principal{}, errdefs.Unauthenticated("API key %s has been revoked", ki.KeyID)
	}
	if ki.Disabled {
		return Principal{}, errdefs.Unauthenticated("API key %s belongs to principal %s, which is disabled", ki.KeyID, ki.PrincipalID)
	}
	if ki.Suspended {
		return Principal{}, errdefs.PermissionDenied("tenant %s is suspended", ki.TenantID)
	}
	a.touch(ctx, ki)
	p := Principal{Subject: ki.Principal, Tenant: ki.TenantID, Roles: ki.Roles, Method: MethodAPIKey, KeyID: ki.KeyID, PrincipalID: ki.PrincipalID, EnvironmentID: ki.EnvironmentID}
	if ki.EnvironmentID != "" {
		p.Roles = nil // an environment key's reach is the worker's routes, never a role's
	}
	if ki.PrincipalID != "" {
		p.Subject = subject(ki.Principal, ki.PrincipalID)
	}
	return p, nil
}

func (a *Authenticator) lookupKey(ctx context.Context, secret logging.Secret) (store.KeyIdentity, error) {
	h := sha256.Sum256([]byte(secret.Reveal()))
	now := a.now()
	a.mu.Lock()
	c, ok := a.cache[h]
	a.mu.Unlock()
	if ok && now.Sub(c.at) < keyCacheTTL {
		if c.unknown {
			return store.KeyIdentity{}, errdefs.NotFound("api key not found")
		}
		return c.ki, nil
	}
	ki, err := a.keys.Authenticate(ctx, secret)
	if errdefs.IsNotFound(err) {
		a.remember(h, cachedKey{at: now, unknown: true})
		return store.KeyIdentity{}, err
	}
	if errdefs.IsUnavailable(err) && ok && !c.unknown && now.Sub(c.at) < staleKeyTTL {
		// The database is away: what this node knew a while ago beats
		// locking every operator out of the status they need.
		return c.ki, nil
	}
	if err != nil {
		return store.KeyIdentity{}, err
	}
	a.remember(h, cachedKey{ki: ki, at: now})
	return ki, nil
}

func (a *Authenticator) remember(h [32]byte, c cachedKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= 10000 { // bound the memory an attacker with many keys could pin
		clear(a.cache)
	}
	a.cache[h] = c
}

// Forget drops everything this node cached about API keys and users: call
// it after revoking a key, changing or disabling a principal, or suspending
// or deleting a tenant. Other nodes notice within keyCacheTTL.
func (a *Authenticator) Forget() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.cache)
	clear(a.seen)
}

// touch records the key's use at most once a minute per key and node; the
// database ignores touches within a minute of the last, whichever node
// sends them.
func (a *Authenticator) touch(ctx context.Context, ki store.KeyIdentity) {
	now := a.now()
	a.mu.Lock()
	last := a.touched[ki.KeyID]
	due := now.Sub(last) >= touchEvery && now.Sub(ki.LastUsedAt) >= touchEvery
	if due {
		if len(a.touched) >= 10000 {
			clear(a.touched)
		}
		a.touched[ki.KeyID] = now
	}
	a.mu.Unlock()
	if !due {
		return
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.keys.Touch(tctx, ki.TenantID, ki.KeyID); err != nil {
		a.log.Warn("recording api key use", "key_id", ki.KeyID, "err", err)
	}
}

func base64URL(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
