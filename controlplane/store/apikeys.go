package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// APIKeyPrefix starts every key corral issues, so that leaked keys are easy to
// find with a scanner.
const APIKeyPrefix = "sk-corral-"

// APIKey describes an issued key. The secret is shown once, at creation.
type APIKey struct {
	TenantID tenant.ID // empty for an operator key
	ID       string
	Name     string
	// PrincipalID is the service principal the key acts as; Principal names
	// it ("service:<name>") and Roles are its roles (policy/).
	PrincipalID string
	Principal   string
	Roles       []string
	Prefix      string // the secret's first characters, to match a leaked key
	// EnvironmentID, for an environment key, is the self-hosted
	// environment whose work (and sessions' events) alone it authorizes.
	EnvironmentID string
	CreatedAt     time.Time
	RevokedAt     *time.Time
	LastUsedAt    *time.Time
}

// NewAPIKey names the key to issue.
type NewAPIKey struct {
	Name string
	// PrincipalID is the service principal the key acts as. Empty: a new
	// service principal named after the key, with Roles (default admin), is
	// made for it in the same transaction.
	PrincipalID string
	Roles       []string
}

// APIKeys issues and lists a tenant's API keys.
type APIKeys struct{ s *Store }

// APIKeys returns the API key repository.
func (s *Store) APIKeys() APIKeys { return APIKeys{s} }

// Create issues a new admin key, with a service principal of its own, for
// the tenant in ctx and returns it with its secret.
func (r APIKeys) Create(ctx context.Context, name string) (APIKey, logging.Secret, error) {
	return r.Issue(ctx, NewAPIKey{Name: name})
}

// Issue issues a key as nk describes for the tenant in ctx. Only the
// secret's SHA-256 is stored. The caller checks that the roles exist in the
// policy.
func (r APIKeys) Issue(ctx context.Context, nk NewAPIKey) (APIKey, logging.Secret, error) {
	return r.issue(ctx, nk, "")
}

// IssueEnvironmentKey issues an environment key for environment envID of
// the tenant in ctx: an API key of a service principal of its own with no
// roles, which authorizes only the environment's work queue and the event
// routes of the environment's sessions that a worker uses (package authz).
// The caller checks that the environment is self-hosted.
func (r APIKeys) IssueEnvironmentKey(ctx context.Context, envID, name string) (APIKey, logging.Secret, error) {
	return r.issue(ctx, NewAPIKey{Name: name}, envID)
}

func (r APIKeys) issue(ctx context.Context, nk NewAPIKey, envID string) (APIKey, logging.Secret, error) {
	if nk.Name = strings.TrimSpace(nk.Name); nk.Name == "" || len(nk.Name) > 200 {
		return APIKey{}, "", errdefs.InvalidArgument("api key name must be 1 to 200 characters")
	}
	if nk.PrincipalID != "" && len(nk.Roles) > 0 {
		return APIKey{}, "", errdefs.InvalidArgument("a key of an existing principal has that principal's roles; grant roles to the principal instead")
	}
	if len(nk.Roles) == 0 && envID == "" {
		nk.Roles = []string{"admin"}
	}
	keyID, secret := newKey()
	var k APIKey
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		principalName := nk.Name
		if envID != "" {
			if _, err := q.GetEnvironment(ctx, db.GetEnvironmentParams{TenantID: tid, ID: envID}); err != nil {
				return translate(err, "environment "+envID)
			}
			// Its own principal, named after the environment and the
			// key, with no roles: nothing a role grants reaches it.
			principalName = "environment:" + envID + ":" + nk.Name
			nk.Roles = []string{}
		}
		if nk.PrincipalID == "" {
			p, err := createPrincipal(ctx, q, tid, NewPrincipal{Kind: PrincipalService, Name: principalName, Roles: nk.Roles})
			if err != nil {
				return err
			}
			nk.PrincipalID = p.ID
		} else {
			p, err := q.GetPrincipal(ctx, db.GetPrincipalParams{TenantID: tid, ID: nk.PrincipalID})
			if err != nil {
				return translate(err, "principal "+nk.PrincipalID)
			}
			if p.Kind != PrincipalService {
				return errdefs.InvalidArgument("principal %s is a %s; API keys belong to service principals", p.ID, p.Kind)
			}
		}
		err := q.CreateAPIKey(ctx, db.CreateAPIKeyParams{
			TenantID:      tid,
			ID:            keyID,
			Name:          nk.Name,
			SecretHash:    HashAPIKey(secret),
			PrincipalID:   nk.PrincipalID,
			Prefix:        keyPrefix(secret),
			EnvironmentID: optText(envID),
		})
		if err != nil {
			return translate(err, "api key")
		}
		row, err := q.GetAPIKey(ctx, db.GetAPIKeyParams{TenantID: tid, ID: keyID})
		k = apiKeyFromRow(db.ListAPIKeysRow(row))
		return translate(err, "api key")
	})
	if err != nil {
		return APIKey{}, "", err
	}
	return k, secret, nil
}

// List returns the tenant's keys, oldest first; only principal's when
// principal is not empty.
func (r APIKeys) List(ctx context.Context, principal string) ([]APIKey, error) {
	var keys []APIKey
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListAPIKeys(ctx, db.ListAPIKeysParams{TenantID: tid, PrincipalID: optText(principal)})
		if err != nil {
			return translate(err, "api keys")
		}
		for _, row := range rows {
			keys = append(keys, apiKeyFromRow(row))
		}
		return nil
	})
	return keys, err
}

// Lookup finds the tenant's key with this secret.
func (r APIKeys) Lookup(ctx context.Context, secret logging.Secret) (APIKey, error) {
	var k APIKey
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		id, err := q.GetAPIKeyIDByHash(ctx, db.GetAPIKeyIDByHashParams{TenantID: tid, SecretHash: HashAPIKey(secret)})
		if err != nil {
			return translate(err, "api key")
		}
		row, err := q.GetAPIKey(ctx, db.GetAPIKeyParams{TenantID: tid, ID: id})
		k = apiKeyFromRow(db.ListAPIKeysRow(row))
		return translate(err, "api key")
	})
	return k, err
}

// Revoke revokes the tenant's key id; revoking twice is not an error.
func (r APIKeys) Revoke(ctx context.Context, id string) (APIKey, error) {
	var k APIKey
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		n, err := q.RevokeAPIKey(ctx, db.RevokeAPIKeyParams{TenantID: tid, ID: id})
		if err == nil && n == 0 {
			err = pgx.ErrNoRows
		}
		if err != nil {
			return translate(err, "api key "+id)
		}
		row, err := q.GetAPIKey(ctx, db.GetAPIKeyParams{TenantID: tid, ID: id})
		k = apiKeyFromRow(db.ListAPIKeysRow(row))
		return translate(err, "api key "+id)
	})
	return k, err
}

// KeyIdentity is what authentication learns from a key, before any tenant
// is known.
type KeyIdentity struct {
	TenantID tenant.ID // empty for an operator key
	KeyID    string
	// PrincipalID is the key's service principal (empty for an operator
	// key); Principal names it, and Roles are its roles.
	PrincipalID string
	Principal   string
	Roles       []string
	// Suspended is set when the key's tenant is suspended.
	Suspended bool
	Revoked   bool
	// Disabled is set when the key's principal is disabled.
	Disabled   bool
	LastUsedAt time.Time // zero if never used
	// EnvironmentID is set for an environment key (IssueEnvironmentKey).
	EnvironmentID string
}

// Authenticate finds the key, of any tenant or an operator, with this
// secret, through the authenticate_api_key function (the only cross-tenant
// read of keys). An unknown key is a not found.
func (r APIKeys) Authenticate(ctx context.Context, secret logging.Secret) (KeyIdentity, error) {
	var (
		ki      KeyIdentity
		tid     pgtype.Text
		pid     pgtype.Text
		status  pgtype.Text
		lastUse pgtype.Timestamptz
		env     pgtype.Text
	)
	err := r.s.pool.QueryRow(ctx, `SELECT tenant_id, key_id, principal_id, principal, roles, tenant_status, revoked, disabled, last_used_at, environment_id FROM authenticate_api_key($1)`, HashAPIKey(secret)).
		Scan(&tid, &ki.KeyID, &pid, &ki.Principal, &ki.Roles, &status, &ki.Revoked, &ki.Disabled, &lastUse, &env)
	if err == pgx.ErrNoRows {
		return KeyIdentity{}, errdefs.NotFound("api key not found")
	}
	if err != nil {
		return KeyIdentity{}, errdefs.Wrap(errdefs.UnavailableKind, err, "looking up api key")
	}
	ki.TenantID = tenant.ID(tid.String)
	ki.PrincipalID = pid.String
	ki.EnvironmentID = env.String
	ki.Suspended = status.Valid && status.String != "active"
	if lastUse.Valid {
		ki.LastUsedAt = lastUse.Time
	}
	return ki, nil
}

// Touch records that key keyID (of tenant tid, empty for an operator key)
// was used. The database ignores touches within a minute of the last.
func (r APIKeys) Touch(ctx context.Context, tid tenant.ID, keyID string) error {
	t := optText(string(tid))
	if _, err := r.s.pool.Exec(ctx, `SELECT touch_api_key($1, $2)`, t, keyID); err != nil {
		return errdefs.Wrap(errdefs.UnavailableKind, err, "recording api key use")
	}
	return nil
}

// HashAPIKey is the stored form of a key.
func HashAPIKey(secret logging.Secret) []byte {
	h := sha256.Sum256([]byte(secret.Reveal()))
	return h[:]
}

// NewOperatorKey makes an operator key's id and secret and the values to
// store (corral admin bootstrap-key inserts them as the owner).
func NewOperatorKey() (id string, secret logging.Secret, hash []byte, prefix string) {
	id, secret = newKey()
	return id, secret, HashAPIKey(secret), keyPrefix(secret)
}

// newKey makes a key's id and its secret from separate random bytes: the id
// is shown in listings and logs and must tell nothing of the secret.
func newKey() (id string, secret logging.Secret) {
	b := make([]byte, 32+12)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	return "key_" + base64.RawURLEncoding.EncodeToString(b[32:]),
		logging.Secret(APIKeyPrefix + base64.RawURLEncoding.EncodeToString(b[:32]))
}

// keyPrefix keeps the key's first characters after the fixed prefix: enough
// to match a leaked key to its row, too few to guess the rest.
func keyPrefix(secret logging.Secret) string {
	return secret.Reveal()[:len(APIKeyPrefix)+6]
}

func apiKeyFromRow(row db.ListAPIKeysRow) APIKey {
	return APIKey{
		TenantID: tenant.ID(row.TenantID), ID: row.ID, Name: row.Name,
		PrincipalID: row.PrincipalID, Principal: row.Kind + ":" + row.PrincipalName, Roles: row.Roles,
		Prefix: row.Prefix, EnvironmentID: row.EnvironmentID.String, CreatedAt: row.CreatedAt.Time,
		RevokedAt: fromTS(row.RevokedAt), LastUsedAt: fromTS(row.LastUsedAt),
	}
}
