package store

import (
	"context"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
)

// ID prefixes of vaults and their credentials, as the Managed Agents API
// has them.
const (
	VaultIDPrefix      = "vlt_"
	CredentialIDPrefix = "vcrd_"
)

// Credential kinds the store holds.
const (
	CredentialStaticBearer = "static_bearer"
	CredentialMCPOAuth     = "mcp_oauth"
	// CredentialModelAPIKey is a tenant's own model API key (a corral
	// extension): sessions that name its vault run their model requests
	// with it, at its ModelBaseURL, instead of with the operator's.
	CredentialModelAPIKey = "model_api_key"
	// CredentialEnvironmentVariable is a secret a session's sandbox holds
	// only as a placeholder in the variable SecretName; the host's egress
	// proxy substitutes it in request headers toward AllowedHosts.
	CredentialEnvironmentVariable = "environment_variable"
)

// envMatchPrefix starts an environment_variable credential's match_url:
// never a URL, and with the variable's name, so a vault holds one active
// credential per variable.
const envMatchPrefix = "corral:environment_variable:"

// modelMatchURL is a model_api_key credential's match_url: never a URL,
// so no MCP server matches it, and fixed, so a vault holds one at most.
const modelMatchURL = "corral:model_api_key"

// MaxCredentialsPerVault bounds a vault's active credentials (the Managed
// Agents API's limit).
const MaxCredentialsPerVault = 20

// Vault is a named collection of a tenant's credentials; sessions name the
// vaults whose credentials they may use (vault_ids).
type Vault struct {
	ID          string
	DisplayName string
	Metadata    map[string]string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ArchivedAt  *time.Time
}

// Credential is a vault's credential without its secrets: nothing the
// store returns carries one, except CredentialFor to the MCP client.
type Credential struct {
	ID          string
	VaultID     string
	DisplayName *string
	Metadata    map[string]string
	// AuthType is the auth object's type (CredentialStaticBearer).
	AuthType string
	// MCPServerURL is the MCP server the credential is sent to, as the
	// tenant gave it. It cannot change after creation.
	MCPServerURL string
	// ExpiresAt is when an mcp_oauth access token expires (nil: unknown).
	ExpiresAt *time.Time
	// Refresh is how an mcp_oauth token is refreshed (nil: it is not).
	Refresh *OAuthRefresh
	// ModelBaseURL is a model_api_key credential's API base URL (nil: the
	// operator's). It cannot change after creation.
	ModelBaseURL *string
	// SecretName is an environment_variable credential's variable (it
	// cannot change after creation), AllowedHosts the hosts its secret is
	// sent to (names and *.suffix patterns).
	SecretName   string
	AllowedHosts []string
	CreatedAt    time.Time
	UpdatedAt    time.Time
	ArchivedAt   *time.Time
}

// OAuthRefresh is an mcp_oauth credential's refresh configuration,
// without its secrets (the refresh token and client secret).
type OAuthRefresh struct {
	ClientID      string `json:"client_id"`
	TokenEndpoint string `json:"token_endpoint"`
	// TokenEndpointAuth is none, client_secret_basic or client_secret_post.
	TokenEndpointAuth string  `json:"token_endpoint_auth"`
	Resource          *string `json:"resource,omitempty"`
	Scope             *string `json:"scope,omitempty"`
}

// CredentialSecrets are a credential's secrets: the token (static bearer
// or OAuth access token) and, for mcp_oauth, the refresh token and client
// secret. They are stored encrypted, as one JSON document.
type CredentialSecrets struct {
	Token        logging.Secret
	RefreshToken logging.Secret
	ClientSecret logging.Secret
}

// SecretsPatch replaces the secrets it sets and keeps the others.
type SecretsPatch struct {
	Token, RefreshToken, ClientSecret *logging.Secret
}

func (p SecretsPatch) empty() bool {
	return p.Token == nil && p.RefreshToken == nil && p.ClientSecret == nil
}

// secretBundle is CredentialSecrets as encrypted (logging.Secret would
// marshal as "[redacted]").
type secretBundle struct {
	Token        string `json:"t"`
	RefreshToken string `json:"r,omitempty"`
	ClientSecret string `json:"c,omitempty"`
}

func sealSecrets(key cipher.AEAD, tid, id string, s CredentialSecrets) (nonce, ct []byte, err error) {
	b, err := json.Marshal(secretBundle{Token: s.Token.Reveal(), RefreshToken: s.RefreshToken.Reveal(), ClientSecret: s.ClientSecret.Reveal()})
	if err != nil {
		return nil, nil, err
	}
	return encryptSecret(key, tid, id, b)
}

func openSecrets(key cipher.AEAD, row db.VaultCredential) (CredentialSecrets, error) {
	b, err := decryptSecret(key, row.TenantID, row.ID, row.SecretNonce, row.Secret)
	if err != nil {
		return CredentialSecrets{}, err
	}
	var sb secretBundle
	if err := json.Unmarshal(b, &sb); err != nil {
		return CredentialSecrets{}, fmt.Errorf("credential %s: decoding its secrets", row.ID)
	}
	return CredentialSecrets{Token: logging.Secret(sb.Token), RefreshToken: logging.Secret(sb.RefreshToken), ClientSecret: logging.Secret(sb.ClientSecret)}, nil
}

func marshalRefresh(r *OAuthRefresh) []byte {
	if r == nil {
		return nil
	}
	b, _ := json.Marshal(r) // strings only
	return b
}

// VaultListOptions filter and page Vaults.List and ListCredentials.
type VaultListOptions struct {
	IncludeArchived bool
	Limit           int
	// After continues a listing after this key (newest first).
	After *Key
}

// Vaults stores a tenant's vaults and credentials, their secrets encrypted
// under the tenant's data key (see datakeys.go).
type Vaults struct {
	s    *Store
	ring *seal.Keyring
}

// Vaults returns the vault repository; ring is the cluster's keyring that
// seals the tenants' data keys. Without one (nil) every vault operation
// is a failed precondition.
func (s *Store) Vaults(ring *seal.Keyring) Vaults { return Vaults{s: s, ring: ring} }

func (r Vaults) tx(ctx context.Context, fn func(q *db.Queries, tid string) error) error {
	if r.ring == nil {
		return errNoKeyring
	}
	return r.s.inTenant(ctx, fn)
}

// Create stores v under a new id.
func (r Vaults) Create(ctx context.Context, v Vault) (Vault, error) {
	var out Vault
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.CreateVault(ctx, db.CreateVaultParams{TenantID: tid, ID: newID(VaultIDPrefix), DisplayName: v.DisplayName, Metadata: marshalMetadata(v.Metadata)})
		if err != nil {
			return translate(err, "vault")
		}
		out, err = vaultFromRow(row)
		return err
	})
	return out, err
}

// Get returns vault id.
func (r Vaults) Get(ctx context.Context, id string) (Vault, error) {
	var out Vault
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetVault(ctx, db.GetVaultParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "vault "+id)
		}
		out, err = vaultFromRow(row)
		return err
	})
	return out, err
}

// Update replaces vault id's name and metadata with what apply returns,
// under the row lock. An archived vault cannot be updated.
func (r Vaults) Update(ctx context.Context, id string, apply func(cur Vault) (Vault, error)) (Vault, error) {
	var out Vault
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.LockVault(ctx, db.LockVaultParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "vault "+id)
		}
		cur, err := vaultFromRow(row)
		if err != nil {
			return err
		}
		if cur.ArchivedAt != nil {
			return errdefs.FailedPrecondition("vault %s is archived and cannot be updated", id)
		}
		next, err := apply(cur)
		if err != nil {
			return err
		}
		row, err = q.UpdateVault(ctx, db.UpdateVaultParams{TenantID: tid, ID: id, DisplayName: next.DisplayName, Metadata: marshalMetadata(next.Metadata)})
		if err != nil {
			return translate(err, "vault "+id)
		}
		out, err = vaultFromRow(row)
		return err
	})
	return out, err
}

// Archive marks vault id and its credentials archived: no new session can
// name it and no session uses its credentials any more. Archiving twice is
// a no-op.
func (r Vaults) Archive(ctx context.Context, id string) (Vault, error) {
	var out Vault
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.ArchiveVault(ctx, db.ArchiveVaultParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "vault "+id)
		}
		if err := q.ArchiveVaultCredentials(ctx, db.ArchiveVaultCredentialsParams{TenantID: tid, VaultID: id}); err != nil {
			return translate(err, "vault "+id)
		}
		out, err = vaultFromRow(row)
		return err
	})
	return out, err
}

// Delete removes vault id and its credentials (their ciphertext with them).
func (r Vaults) Delete(ctx context.Context, id string) error {
	return r.tx(ctx, func(q *db.Queries, tid string) error {
		n, err := q.DeleteVault(ctx, db.DeleteVaultParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "vault "+id)
		}
		if n == 0 {
			return errdefs.NotFound("vault %s not found", id)
		}
		return nil
	})
}

// List returns the tenant's vaults, newest first, and whether more follow.
func (r Vaults) List(ctx context.Context, opts VaultListOptions) ([]Vault, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.After)
	var out []Vault
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListVaults(ctx, db.ListVaultsParams{TenantID: tid, IncludeArchived: opts.IncludeArchived, BeforeCreated: kc, BeforeID: kid, Lim: lim})
		if err != nil {
			return translate(err, "vaults")
		}
		for _, row := range rows {
			v, err := vaultFromRow(row)
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	more := len(out) > n
	if more {
		out = out[:n]
	}
	return out, more, nil
}

// CreateCredential stores c in vault vaultID with its secret encrypted
// under the tenant's data key. The vault must exist and not be archived;
// it holds at most MaxCredentialsPerVault active credentials and one per
// MCP server (a second is AlreadyExists).
func (r Vaults) CreateCredential(ctx context.Context, vaultID string, c Credential, secrets CredentialSecrets) (Credential, error) {
	var match string
	switch c.AuthType {
	case CredentialStaticBearer, CredentialMCPOAuth:
		var err error
		if match, err = NormalizeMCPServerURL(c.MCPServerURL); err != nil {
			return Credential{}, err
		}
	case CredentialModelAPIKey:
		match, c.MCPServerURL = modelMatchURL, ""
	case CredentialEnvironmentVariable:
		if c.SecretName == "" || len(c.AllowedHosts) == 0 {
			return Credential{}, errdefs.InvalidArgument("an environment_variable credential needs a secret_name and allowed hosts")
		}
		match, c.MCPServerURL = envMatchPrefix+c.SecretName, ""
	default:
		return Credential{}, errdefs.InvalidArgument("credentials of type %q are not stored", c.AuthType)
	}
	var err error
	var out Credential
	err = r.tx(ctx, func(q *db.Queries, tid string) error {
		vrow, err := q.LockVault(ctx, db.LockVaultParams{TenantID: tid, ID: vaultID})
		if err != nil {
			return translate(err, "vault "+vaultID)
		}
		if vrow.ArchivedAt.Valid {
			return errdefs.FailedPrecondition("vault %s is archived; archived vaults take no new credentials", vaultID)
		}
		n, err := q.CountActiveVaultCredentials(ctx, db.CountActiveVaultCredentialsParams{TenantID: tid, VaultID: vaultID})
		if err != nil {
			return translate(err, "vault "+vaultID)
		}
		if n >= MaxCredentialsPerVault {
			return errdefs.FailedPrecondition("vault %s already holds %d active credentials, the most a vault may hold; archive one first", vaultID, n)
		}
		key, err := dataKey(ctx, q, r.ring, tid)
		if err != nil {
			return err
		}
		id := newID(CredentialIDPrefix)
		nonce, ct, err := sealSecrets(key, tid, id, secrets)
		if err != nil {
			return err
		}
		row, err := q.CreateVaultCredential(ctx, db.CreateVaultCredentialParams{
			TenantID: tid, VaultID: vaultID, ID: id, DisplayName: text(c.DisplayName), Metadata: marshalMetadata(c.Metadata),
			AuthType: c.AuthType, McpServerUrl: c.MCPServerURL, MatchUrl: match, SecretNonce: nonce, Secret: ct,
			ExpiresAt: ts(c.ExpiresAt), Oauth: marshalRefresh(c.Refresh), ModelBaseUrl: text(c.ModelBaseURL),
			SecretName: envName(c), AllowedHosts: marshalHosts(c),
		})
		if err != nil {
			err = translate(err, "credential")
			if errdefs.IsAlreadyExists(err) && c.AuthType == CredentialEnvironmentVariable {
				return errdefs.AlreadyExists("vault %s already has an active environment_variable credential for %s; archive it, or update its secret", vaultID, c.SecretName)
			}
			if errdefs.IsAlreadyExists(err) && c.AuthType == CredentialModelAPIKey {
				return errdefs.AlreadyExists("vault %s already has an active model_api_key credential; archive it, or update its key", vaultID)
			}
			if errdefs.IsAlreadyExists(err) {
				return errdefs.AlreadyExists("vault %s already has an active credential for %s; archive it, or update its secret", vaultID, match)
			}
			return err
		}
		out, err = credentialFromRow(row)
		return err
	})
	return out, err
}

// GetCredential returns credential id of vault vaultID, without its secret.
func (r Vaults) GetCredential(ctx context.Context, vaultID, id string) (Credential, error) {
	var out Credential
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetVaultCredential(ctx, db.GetVaultCredentialParams{TenantID: tid, VaultID: vaultID, ID: id})
		if err != nil {
			return translate(err, "credential "+id)
		}
		out, err = credentialFromRow(row)
		return err
	})
	return out, err
}

// UpdateCredential replaces credential id's name, metadata, expiry and
// refresh configuration with what apply returns, and the secrets its patch
// sets (encrypted anew). The kind and the MCP server URL never change. An
// archived credential cannot be updated.
func (r Vaults) UpdateCredential(ctx context.Context, vaultID, id string, apply func(cur Credential) (Credential, SecretsPatch, error)) (Credential, error) {
	var out Credential
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.LockVaultCredential(ctx, db.LockVaultCredentialParams{TenantID: tid, VaultID: vaultID, ID: id})
		if err != nil {
			return translate(err, "credential "+id)
		}
		cur, err := credentialFromRow(row)
		if err != nil {
			return err
		}
		if cur.ArchivedAt != nil {
			return errdefs.FailedPrecondition("credential %s is archived and cannot be updated", id)
		}
		next, patch, err := apply(cur)
		if err != nil {
			return err
		}
		nonce, ct := row.SecretNonce, row.Secret
		if !patch.empty() {
			key, err := dataKey(ctx, q, r.ring, tid)
			if err != nil {
				return err
			}
			secrets, err := openSecrets(key, row)
			if err != nil {
				return err
			}
			for _, p := range []struct{ to, from *logging.Secret }{{&secrets.Token, patch.Token}, {&secrets.RefreshToken, patch.RefreshToken}, {&secrets.ClientSecret, patch.ClientSecret}} {
				if p.from != nil {
					*p.to = *p.from
				}
			}
			if nonce, ct, err = sealSecrets(key, tid, id, secrets); err != nil {
				return err
			}
		}
		row, err = q.UpdateVaultCredential(ctx, db.UpdateVaultCredentialParams{
			TenantID: tid, VaultID: vaultID, ID: id, DisplayName: text(next.DisplayName), Metadata: marshalMetadata(next.Metadata), SecretNonce: nonce, Secret: ct,
			ExpiresAt: ts(next.ExpiresAt), Oauth: marshalRefresh(next.Refresh), AllowedHosts: marshalHosts(Credential{AuthType: cur.AuthType, AllowedHosts: next.AllowedHosts}),
		})
		if err != nil {
			return translate(err, "credential "+id)
		}
		out, err = credentialFromRow(row)
		return err
	})
	return out, err
}

// ArchiveCredential marks credential id archived: no session sends it any
// more, and its MCP server may take a new credential. Archiving twice is a
// no-op.
func (r Vaults) ArchiveCredential(ctx context.Context, vaultID, id string) (Credential, error) {
	var out Credential
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		row, err := q.ArchiveVaultCredential(ctx, db.ArchiveVaultCredentialParams{TenantID: tid, VaultID: vaultID, ID: id})
		if err != nil {
			return translate(err, "credential "+id)
		}
		out, err = credentialFromRow(row)
		return err
	})
	return out, err
}

// DeleteCredential removes credential id and its ciphertext.
func (r Vaults) DeleteCredential(ctx context.Context, vaultID, id string) error {
	return r.tx(ctx, func(q *db.Queries, tid string) error {
		n, err := q.DeleteVaultCredential(ctx, db.DeleteVaultCredentialParams{TenantID: tid, VaultID: vaultID, ID: id})
		if err != nil {
			return translate(err, "credential "+id)
		}
		if n == 0 {
			return errdefs.NotFound("credential %s not found", id)
		}
		return nil
	})
}

// ListCredentials returns vault vaultID's credentials, newest first, and
// whether more follow. A vault that does not exist is NotFound.
func (r Vaults) ListCredentials(ctx context.Context, vaultID string, opts VaultListOptions) ([]Credential, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.After)
	var out []Credential
	err := r.tx(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.GetVault(ctx, db.GetVaultParams{TenantID: tid, ID: vaultID}); err != nil {
			return translate(err, "vault "+vaultID)
		}
		rows, err := q.ListVaultCredentials(ctx, db.ListVaultCredentialsParams{TenantID: tid, VaultID: vaultID, IncludeArchived: opts.IncludeArchived, BeforeCreated: kc, BeforeID: kid, Lim: lim})
		if err != nil {
			return translate(err, "credentials")
		}
		for _, row := range rows {
			c, err := credentialFromRow(row)
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	more := len(out) > n
	if more {
		out = out[:n]
	}
	return out, more, nil
}

// SessionCredential is a credential with its secrets, for the MCP client.
type SessionCredential struct {
	Credential
	Secrets CredentialSecrets
}

// CredentialFor returns the credential that session sessionID may use with
// the MCP server at serverURL: an active credential for that server
// (matched by normalized URL) in an active vault the session names; where
// several vaults hold one, the first in the session's vault_ids wins. ok
// is false when there is none. The MCP client is its only caller.
func (r Vaults) CredentialFor(ctx context.Context, sessionID, serverURL string) (cred SessionCredential, ok bool, err error) {
	match, err := NormalizeMCPServerURL(serverURL)
	if err != nil {
		return cred, false, nil // no credential can match a URL that is not one
	}
	cred, ok, _, err = r.credentialFor(ctx, sessionID, match)
	return cred, ok, err
}

// ModelCredentialFor returns the model_api_key credential session
// sessionID runs its model requests with: the active one in the first
// active vault of its vault_ids that holds one. ok is false when there is
// none (the operator's model access applies); vaults is false when the
// session names no vault at all, which stays so (a session's vaults are
// fixed when it is created). The agent loop's model picker is its only
// caller.
func (r Vaults) ModelCredentialFor(ctx context.Context, sessionID string) (cred SessionCredential, ok, vaults bool, err error) {
	return r.credentialFor(ctx, sessionID, modelMatchURL)
}

// credentialFor returns the credential matching match in the first active
// vault of the session's vault_ids that holds one, and whether the session
// names any vault.
func (r Vaults) credentialFor(ctx context.Context, sessionID, match string) (cred SessionCredential, ok, vaults bool, err error) {
	err = r.tx(ctx, func(q *db.Queries, tid string) error {
		srow, err := q.GetSession(ctx, db.GetSessionParams{TenantID: tid, ID: sessionID})
		if err != nil {
			return translate(err, "session "+sessionID)
		}
		var ids []string
		if err := json.Unmarshal(srow.VaultIds, &ids); err != nil || len(ids) == 0 {
			return err
		}
		vaults = true
		rows, err := q.SessionMCPCredentials(ctx, db.SessionMCPCredentialsParams{TenantID: tid, VaultIds: ids, MatchUrl: match})
		if err != nil || len(rows) == 0 {
			return translate(err, "credentials")
		}
		slices.SortFunc(rows, func(a, b db.VaultCredential) int { return slices.Index(ids, a.VaultID) - slices.Index(ids, b.VaultID) })
		key, err := dataKey(ctx, q, r.ring, tid)
		if err != nil {
			return err
		}
		if cred.Secrets, err = openSecrets(key, rows[0]); err != nil {
			return err
		}
		if cred.Credential, err = credentialFromRow(rows[0]); err != nil {
			return err
		}
		ok = true
		return nil
	})
	return cred, ok && err == nil, vaults && err == nil, err
}

// StoreRefreshed stores an mcp_oauth credential's refreshed token (and the
// refresh token, when the endpoint rotated it) if the credential has not
// changed since c was read; stored is false when it has (another refresh
// won, or the tenant updated or archived it), and the caller reads it again.
func (r Vaults) StoreRefreshed(ctx context.Context, c SessionCredential, token, refreshToken logging.Secret, expiresAt *time.Time) (stored bool, err error) {
	err = r.tx(ctx, func(q *db.Queries, tid string) error {
		key, err := dataKey(ctx, q, r.ring, tid)
		if err != nil {
			return err
		}
		secrets := c.Secrets
		secrets.Token = token
		if refreshToken != "" {
			secrets.RefreshToken = refreshToken
		}
		nonce, ct, err := sealSecrets(key, tid, c.ID, secrets)
		if err != nil {
			return err
		}
		n, err := q.StoreRefreshedToken(ctx, db.StoreRefreshedTokenParams{
			TenantID: tid, VaultID: c.VaultID, ID: c.ID, SecretNonce: nonce, Secret: ct, ExpiresAt: ts(expiresAt),
			UpdatedAt: ts(&c.UpdatedAt),
		})
		if err != nil {
			return translate(err, "credential "+c.ID)
		}
		stored = n == 1
		return nil
	})
	return stored, err
}

// checkVaults refuses vault ids that do not name an active vault of tenant
// tid, in the caller's transaction (which holds them against an archive
// until it ends).
func checkVaults(ctx context.Context, q *db.Queries, tid string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	active, err := q.ActiveVaultIDs(ctx, db.ActiveVaultIDsParams{TenantID: tid, Ids: ids})
	if err != nil {
		return translate(err, "vaults")
	}
	for _, id := range ids {
		if !slices.Contains(active, id) {
			return errdefs.InvalidArgument("vault_ids: vault %s does not exist or is archived", id)
		}
	}
	return nil
}

// NormalizeMCPServerURL is the form in which a credential's mcp_server_url
// and an agent's MCP server URL are compared: scheme and host in lower
// case, no default port, no trailing slash, no fragment. It must be an
// http or https URL without user information.
func NormalizeMCPServerURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "HTTP" && u.Scheme != "HTTPS") || u.Host == "" || u.Opaque != "" {
		return "", errdefs.InvalidArgument("mcp_server_url: %q is not an http or https URL", truncateURL(raw))
	}
	if u.User != nil {
		return "", errdefs.InvalidArgument("mcp_server_url: user information in the URL is not allowed; the credential carries the secret")
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if p := u.Port(); p != "" && !(scheme == "https" && p == "443") && !(scheme == "http" && p == "80") {
		host += ":" + p
	}
	out := scheme + "://" + host + strings.TrimRight(u.EscapedPath(), "/")
	if u.RawQuery != "" {
		out += "?" + u.RawQuery
	}
	return out, nil
}

func truncateURL(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func vaultFromRow(row db.Vault) (Vault, error) {
	md, err := unmarshalMetadata(row.Metadata)
	if err != nil {
		return Vault{}, err
	}
	return Vault{
		ID: row.ID, DisplayName: row.DisplayName, Metadata: md,
		CreatedAt: row.CreatedAt.Time, UpdatedAt: row.UpdatedAt.Time, ArchivedAt: fromTS(row.ArchivedAt),
	}, nil
}

func credentialFromRow(row db.VaultCredential) (Credential, error) {
	md, err := unmarshalMetadata(row.Metadata)
	if err != nil {
		return Credential{}, err
	}
	c := Credential{
		ID: row.ID, VaultID: row.VaultID, DisplayName: fromText(row.DisplayName), Metadata: md,
		AuthType: row.AuthType, MCPServerURL: row.McpServerUrl, ExpiresAt: fromTS(row.ExpiresAt), ModelBaseURL: fromText(row.ModelBaseUrl),
		SecretName: row.SecretName.String,
		CreatedAt:  row.CreatedAt.Time, UpdatedAt: row.UpdatedAt.Time, ArchivedAt: fromTS(row.ArchivedAt),
	}
	if len(row.AllowedHosts) > 0 {
		if err := json.Unmarshal(row.AllowedHosts, &c.AllowedHosts); err != nil {
			return Credential{}, fmt.Errorf("credential %s: decoding its allowed hosts: %w", row.ID, err)
		}
	}
	if len(row.Oauth) > 0 {
		c.Refresh = &OAuthRefresh{}
		if err := json.Unmarshal(row.Oauth, c.Refresh); err != nil {
			return Credential{}, fmt.Errorf("credential %s: decoding its refresh configuration: %w", row.ID, err)
		}
	}
	return c, nil
}

func envName(c Credential) pgtype.Text {
	if c.AuthType != CredentialEnvironmentVariable {
		return pgtype.Text{}
	}
	return pgtype.Text{String: c.SecretName, Valid: true}
}

func marshalHosts(c Credential) []byte {
	if c.AuthType != CredentialEnvironmentVariable {
		return nil
	}
	b, _ := json.Marshal(c.AllowedHosts) // strings only
	return b
}

// EgressCredential is an environment_variable credential as a session's
// sandbox gets it: the variable, its placeholder (the sandbox's value)
// and the secret with its hosts (the host's egress proxy's only).
type EgressCredential struct {
	CredentialID string
	SecretName   string
	Placeholder  string
	Secret       logging.Secret
	AllowedHosts []string
}

// PlaceholderPrefix starts every placeholder.
const PlaceholderPrefix = "corral-placeholder-"

// EgressCredentialsFor returns the environment_variable credentials of
// session sessionID: the active ones in its active vaults, one per
// variable (the first vault of its vault_ids that holds one wins), sorted
// by variable. Each placeholder is derived from the session's random seed
// (made here on first use) and the credential's id, never from the secret:
// the same on every node and at every call, different in every session.
// vaults says whether the session names any vault (one that does may have
// had credentials its sandbox is to forget). The fleet's mount step is its
// only caller.
func (r Vaults) EgressCredentialsFor(ctx context.Context, sessionID string) (out []EgressCredential, vaults bool, err error) {
	err = r.tx(ctx, func(q *db.Queries, tid string) error {
		srow, err := q.GetSession(ctx, db.GetSessionParams{TenantID: tid, ID: sessionID})
		if err != nil {
			return translate(err, "session "+sessionID)
		}
		var ids []string
		if err := json.Unmarshal(srow.VaultIds, &ids); err != nil || len(ids) == 0 {
			return err
		}
		vaults = true
		rows, err := q.SessionEnvironmentCredentials(ctx, db.SessionEnvironmentCredentialsParams{TenantID: tid, VaultIds: ids})
		if err != nil || len(rows) == 0 {
			return translate(err, "credentials")
		}
		slices.SortStableFunc(rows, func(a, b db.VaultCredential) int { return slices.Index(ids, a.VaultID) - slices.Index(ids, b.VaultID) })
		seed := srow.EgressSeed
		if len(seed) == 0 {
			fresh := make([]byte, 32)
			rand.Read(fresh)
			if seed, err = q.SessionEgressSeed(ctx, db.SessionEgressSeedParams{TenantID: tid, ID: sessionID, Seed: fresh}); err != nil {
				return translate(err, "session "+sessionID)
			}
		}
		key, err := dataKey(ctx, q, r.ring, tid)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, row := range rows {
			c, err := credentialFromRow(row)
			if err != nil {
				return err
			}
			if seen[c.SecretName] {
				continue
			}
			seen[c.SecretName] = true
			secrets, err := openSecrets(key, row)
			if err != nil {
				return err
			}
			out = append(out, EgressCredential{
				CredentialID: c.ID, SecretName: c.SecretName, Placeholder: placeholder(seed, c.ID),
				Secret: secrets.Token, AllowedHosts: c.AllowedHosts,
			})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b EgressCredential) int { return strings.Compare(a.SecretName, b.SecretName) })
	return out, vaults, err
}

// placeholder is credential id's placeholder in the session of seed.
func placeholder(seed []byte, id string) string {
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(id))
	return PlaceholderPrefix + hex.EncodeToString(m.Sum(nil)[:16])
}
