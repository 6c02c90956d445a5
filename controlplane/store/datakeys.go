package store

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/seal"
)

// Envelope encryption of tenant secrets (vault credentials).
//
//	secret  --AES-256-GCM(data key, aad = tenant/credential)-->  vault_credentials.secret
//	data key --seal.Keyring (the cluster's KEK, aad = tenant)-->  tenant_data_keys
//
// Each tenant has one 32-byte data key, made on its first use. The database
// holds it only sealed by the cluster's keyring, with the id of the key that
// sealed it; a keyring rotation (a new key first in the seal key file)
// still opens it, and the first use after the rotation reseals it under the
// new key, so the old key can be dropped once every tenant has been used.

// dataKeyBytes is the size of a tenant's data key (AES-256).
const dataKeyBytes = 32

func dataKeyPurpose(tid string) string { return "tenant-data-key/" + tid }

func credentialAAD(tid, credentialID string) []byte {
	return []byte("vault-credential/" + tid + "/" + credentialID)
}

// errNoKeyring is the answer of every vault operation on a store that was
// given no keyring.
var errNoKeyring = errdefs.FailedPrecondition("vaults need the cluster's seal keyring, which this node was not given")

// dataKey returns tenant tid's data key as an AEAD, making and storing it
// on first use, in the caller's transaction.
func dataKey(ctx context.Context, q *db.Queries, ring *seal.Keyring, tid string) (cipher.AEAD, error) {
	if ring == nil {
		return nil, errNoKeyring
	}
	row, err := q.GetTenantDataKey(ctx, tid)
	if errors.Is(err, pgx.ErrNoRows) {
		raw := make([]byte, dataKeyBytes)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		env, serr := ring.Seal(dataKeyPurpose(tid), raw)
		if serr != nil {
			return nil, serr
		}
		if err := q.CreateTenantDataKey(ctx, db.CreateTenantDataKeyParams{TenantID: tid, SealKeyID: env.KeyID, Nonce: env.Nonce, Sealed: env.Data}); err != nil {
			return nil, translate(err, "tenant data key")
		}
		// Another first use may have won the insert: read what is stored.
		row, err = q.GetTenantDataKey(ctx, tid)
	}
	if err != nil {
		return nil, translate(err, "tenant data key")
	}
	raw, err := ring.Open(dataKeyPurpose(tid), seal.Sealed{KeyID: row.SealKeyID, Nonce: row.Nonce, Data: row.Sealed})
	if err != nil {
		return nil, fmt.Errorf("opening the data key of tenant %s: %w", tid, err)
	}
	if cur := ring.CurrentID(); row.SealKeyID != cur {
		env, err := ring.Seal(dataKeyPurpose(tid), raw)
		if err != nil {
			return nil, err
		}
		if err := q.ResealTenantDataKey(ctx, db.ResealTenantDataKeyParams{
			TenantID: tid, SealKeyID: row.SealKeyID, SealKeyID_2: env.KeyID, Nonce: env.Nonce, Sealed: env.Data,
		}); err != nil {
			return nil, translate(err, "tenant data key")
		}
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// encryptSecret encrypts a credential's secret under the tenant's data key.
func encryptSecret(key cipher.AEAD, tid, credentialID string, secret []byte) (nonce, ciphertext []byte, err error) {
	nonce = make([]byte, key.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, err
	}
	return nonce, key.Seal(nil, nonce, secret, credentialAAD(tid, credentialID)), nil
}

func decryptSecret(key cipher.AEAD, tid, credentialID string, nonce, ciphertext []byte) ([]byte, error) {
	if len(nonce) != key.NonceSize() {
		return nil, fmt.Errorf("credential %s: a stored nonce of %d bytes", credentialID, len(nonce))
	}
	out, err := key.Open(nil, nonce, ciphertext, credentialAAD(tid, credentialID))
	if err != nil {
		return nil, fmt.Errorf("credential %s: the tenant's data key does not open its secret", credentialID)
	}
	return out, nil
}
