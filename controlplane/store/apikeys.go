package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"time"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// APIKeyPrefix starts every key corral issues, so that leaked keys are easy to
// find with a scanner.
const APIKeyPrefix = "crl_"

// APIKey describes an issued key. The secret is shown once, at creation.
type APIKey struct {
	TenantID  tenant.ID
	ID        string
	Name      string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// APIKeys issues and lists a tenant's API keys.
type APIKeys struct{ s *Store }

// APIKeys returns the API key repository.
func (s *Store) APIKeys() APIKeys { return APIKeys{s} }

// Create issues a new key for the tenant in ctx and returns it with its
// secret. Only the secret's SHA-256 is stored.
func (r APIKeys) Create(ctx context.Context, name string) (APIKey, logging.Secret, error) {
	if name = strings.TrimSpace(name); name == "" || len(name) > 200 {
		return APIKey{}, "", errdefs.InvalidArgument("api key name must be 1 to 200 characters")
	}
	id, err := tenant.Required(ctx)
	if err != nil {
		return APIKey{}, "", err
	}
	keyID, secret := newKey()
	var k APIKey
	err = r.s.inTenant(ctx, func(q *db.Queries) error {
		row, err := q.CreateAPIKey(ctx, db.CreateAPIKeyParams{
			TenantID:   string(id),
			ID:         keyID,
			Name:       name,
			SecretHash: HashAPIKey(secret),
		})
		if err != nil {
			return translate(err, "api key")
		}
		k = apiKeyFromRow(row.TenantID, row.ID, row.Name, row.CreatedAt.Time, row.RevokedAt.Time, row.RevokedAt.Valid)
		return nil
	})
	if err != nil {
		return APIKey{}, "", err
	}
	return k, secret, nil
}

// List returns the tenant's keys, oldest first.
func (r APIKeys) List(ctx context.Context) ([]APIKey, error) {
	var keys []APIKey
	err := r.s.inTenant(ctx, func(q *db.Queries) error {
		rows, err := q.ListAPIKeys(ctx)
		if err != nil {
			return translate(err, "api keys")
		}
		for _, row := range rows {
			keys = append(keys, apiKeyFromRow(row.TenantID, row.ID, row.Name, row.CreatedAt.Time, row.RevokedAt.Time, row.RevokedAt.Valid))
		}
		return nil
	})
	return keys, err
}

// Lookup finds the tenant's key with this secret.
func (r APIKeys) Lookup(ctx context.Context, secret logging.Secret) (APIKey, error) {
	var k APIKey
	err := r.s.inTenant(ctx, func(q *db.Queries) error {
		row, err := q.GetAPIKeyByHash(ctx, HashAPIKey(secret))
		if err != nil {
			return translate(err, "api key")
		}
		k = apiKeyFromRow(row.TenantID, row.ID, row.Name, row.CreatedAt.Time, row.RevokedAt.Time, row.RevokedAt.Valid)
		return nil
	})
	return k, err
}

// HashAPIKey is the stored form of a key.
func HashAPIKey(secret logging.Secret) []byte {
	h := sha256.Sum256([]byte(secret.Reveal()))
	return h[:]
}

func newKey() (id string, secret logging.Secret) {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	enc := base64.RawURLEncoding.EncodeToString(b)
	return "key_" + enc[:16], logging.Secret(APIKeyPrefix + enc)
}

func apiKeyFromRow(tenantID, id, name string, created, revoked time.Time, isRevoked bool) APIKey {
	k := APIKey{TenantID: tenant.ID(tenantID), ID: id, Name: name, CreatedAt: created}
	if isRevoked {
		k.RevokedAt = &revoked
	}
	return k
}
