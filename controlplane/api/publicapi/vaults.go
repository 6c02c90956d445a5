package publicapi

import (
	"encoding/json"
	"net/http"
	"time"

	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// Vaults and credentials, as the Managed Agents API has them:
//
//	POST   /v1/vaults                                  create {display_name, metadata?}
//	GET    /v1/vaults                                  list (limit, page, include_archived)
//	GET    /v1/vaults/{id}                             get
//	POST   /v1/vaults/{id}                             update {display_name?, metadata? patch}
//	DELETE /v1/vaults/{id}                             delete (its credentials with it)
//	POST   /v1/vaults/{id}/archive                     archive (its credentials with it)
//	POST   /v1/vaults/{id}/credentials                 create {auth, display_name?, metadata?}
//	GET    /v1/vaults/{id}/credentials                 list
//	GET    /v1/vaults/{id}/credentials/{credential_id} get
//	POST   /v1/vaults/{id}/credentials/{credential_id} update {auth?, display_name?, metadata?}
//	DELETE /v1/vaults/{id}/credentials/{credential_id} delete
//	POST   /v1/vaults/{id}/credentials/{credential_id}/archive
//
// A credential's secrets (auth.token; auth.access_token, refresh.refresh_token
// and token_endpoint_auth.client_secret) are write-only: no response carries
// them, no error message repeats them, and the store keeps them only as
// ciphertext (controlplane/store/datakeys.go). The control plane's MCP
// client sends a static_bearer token, or an mcp_oauth access token
// (refreshed at its token_endpoint before it expires), as the Authorization
// bearer to the credential's mcp_server_url, for sessions that name its
// vault in vault_ids. environment_variable is refused (see
// unsupportedFields).
//
// A corral extension, model_api_key, keeps a tenant's own model access:
// auth {type: "model_api_key", api_key (write-only), base_url?}. A session
// naming its vault in vault_ids runs its model requests with that key (at
// base_url, https; http to loopback only where the server allows private
// networks) instead of the operator's; a vault holds one at most. Nodes
// whose model client is the fake refuse them.

// Bounds, as the Managed Agents API documents them.
const (
	maxVaultName     = 255
	maxCredName      = 255
	maxBearerToken   = 8192
	maxMCPServerURL  = 2047
	maxSessionVaults = 20
	maxClientID      = 1024
	maxOAuthScope    = 1024
)

type vaultResponse struct {
	Type        string            `json:"type"`
	ID          string            `json:"id"`
	DisplayName string            `json:"display_name"`
	Metadata    map[string]string `json:"metadata"`
	CreatedAt   string            `json:"created_at"`
	UpdatedAt   string            `json:"updated_at"`
	ArchivedAt  *string           `json:"archived_at"`
}

// credentialAuth is a static_bearer auth object as responses carry it: its
// non-secret fields only.
type credentialAuth struct {
	Type         string `json:"type"`
	MCPServerURL string `json:"mcp_server_url"`
}

// oauthAuth is an mcp_oauth auth object as responses carry it.
type oauthAuth struct {
	Type         string        `json:"type"`
	MCPServerURL string        `json:"mcp_server_url"`
	ExpiresAt    *string       `json:"expires_at"`
	Refresh      *oauthRefresh `json:"refresh"`
}

type oauthRefresh struct {
	ClientID          string      `json:"client_id"`
	TokenEndpoint     string      `json:"token_endpoint"`
	TokenEndpointAuth typedString `json:"token_endpoint_auth"`
	Resource          *string     `json:"resource"`
	Scope             *string     `json:"scope"`
}

// modelAuth is a model_api_key auth object as responses carry it: its
// base URL, never its key.
type modelAuth struct {
	Type    string  `json:"type"`
	BaseURL *string `json:"base_url"`
}

// modelAPIKey is a model_api_key auth object in a request.
type modelAPIKey struct {
	Type    *string         `json:"type"`
	APIKey  *string         `json:"api_key"`
	BaseURL json.RawMessage `json:"base_url"`
}

type credentialResponse struct {
	Type        string            `json:"type"`
	ID          string            `json:"id"`
	VaultID     string            `json:"vault_id"`
	DisplayName *string           `json:"display_name"`
	Auth        any               `json:"auth"`
	Metadata    map[string]string `json:"metadata"`
	CreatedAt   string            `json:"created_at"`
	UpdatedAt   string            `json:"updated_at"`
	ArchivedAt  *string           `json:"archived_at"`
}

func vaultOut(v store.Vault) vaultResponse {
	return vaultResponse{Type: "vault", ID: v.ID, DisplayName: v.DisplayName, Metadata: v.Metadata,
		CreatedAt: ts(v.CreatedAt), UpdatedAt: ts(v.UpdatedAt), ArchivedAt: tsPtr(v.ArchivedAt)}
}

func credentialOut(c store.Credential) credentialResponse {
	var auth any = credentialAuth{Type: c.AuthType, MCPServerURL: c.MCPServerURL}
	if c.AuthType == store.CredentialModelAPIKey {
		auth = modelAuth{Type: c.AuthType, BaseURL: c.ModelBaseURL}
	}
	if c.AuthType == store.CredentialMCPOAuth {
		a := oauthAuth{Type: c.AuthType, MCPServerURL: c.MCPServerURL, ExpiresAt: tsPtr(c.ExpiresAt)}
		if r := c.Refresh; r != nil {
			a.Refresh = &oauthRefresh{ClientID: r.ClientID, TokenEndpoint: r.TokenEndpoint, TokenEndpointAuth: typedString{Type: r.TokenEndpointAuth}, Resource: r.Resource, Scope: r.Scope}
		}
		auth = a
	}
	return credentialResponse{Type: "vault_credential", ID: c.ID, VaultID: c.VaultID, DisplayName: c.DisplayName,
		Auth: auth, Metadata: c.Metadata, CreatedAt: ts(c.CreatedAt), UpdatedAt: ts(c.UpdatedAt), ArchivedAt: tsPtr(c.ArchivedAt)}
}

func (h *Handler) vaults() store.Vaults { return h.store.Vaults(h.keyring) }

type vaultFields struct {
	DisplayName json.RawMessage `json:"display_name"`
	Metadata    json.RawMessage `json:"metadata"`
}

// applyVault applies a create (create true) or update request to v.
func applyVault(b []byte, v store.Vault, create bool) (store.Vault, error) {
	var f vaultFields
	if err := decodeObject(b, "request body", &f); err != nil {
		return v, err
	}
	if create || present(f.DisplayName) {
		name, err := stringField(f.DisplayName, "display_name")
		if err != nil {
			return v, err
		}
		if err := checkLen(name, "display_name", 1, maxVaultName); err != nil {
			return v, err
		}
		v.DisplayName = name
	}
	var err error
	if create {
		v.Metadata, err = metadataCreate(f.Metadata)
	} else {
		v.Metadata, err = metadataPatch(v.Metadata, f.Metadata, false)
	}
	return v, err
}

func (h *Handler) writeVault(w http.ResponseWriter, r *http.Request, v store.Vault, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, vaultOut(v))
}

func (h *Handler) createVault(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := applyVault(b, store.Vault{}, true)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v, err = h.vaults().Create(r.Context(), v)
	h.writeVault(w, r, v, err)
}

func (h *Handler) getVault(w http.ResponseWriter, r *http.Request) {
	v, err := h.vaults().Get(r.Context(), r.PathValue("id"))
	h.writeVault(w, r, v, err)
}

func (h *Handler) updateVault(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := decodeObject(b, "request body", &vaultFields{}); err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := h.vaults().Update(r.Context(), r.PathValue("id"), func(cur store.Vault) (store.Vault, error) {
		return applyVault(b, cur, false)
	})
	h.writeVault(w, r, v, err)
}

func (h *Handler) archiveVault(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := h.vaults().Archive(r.Context(), r.PathValue("id"))
	h.writeVault(w, r, v, err)
}

func (h *Handler) deleteVault(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := h.vaults().Delete(r.Context(), id); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "vault_deleted"})
}

// listOptions reads limit, include_archived and page for list.
func listOptions(r *http.Request, list string) (store.VaultListOptions, error) {
	q := r.URL.Query()
	var opts store.VaultListOptions
	var err error
	if opts.Limit, err = queryLimit(q); err != nil {
		return opts, err
	}
	if opts.IncludeArchived, err = queryBool(q, "include_archived"); err != nil {
		return opts, err
	}
	c, err := decodeCursor(q, list, "desc")
	if err != nil {
		return opts, err
	}
	if c != nil {
		opts.After = c.key()
	}
	return opts, nil
}

func (h *Handler) listVaults(w http.ResponseWriter, r *http.Request) {
	opts, err := listOptions(r, "vaults")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	vs, more, err := h.vaults().List(r.Context(), opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[vaultResponse]{Data: []vaultResponse{}}
	for _, v := range vs {
		out.Data = append(out.Data, vaultOut(v))
	}
	if more && len(vs) > 0 {
		last := vs[len(vs)-1]
		out.NextPage = keyCursor("vaults", "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

type credentialFields struct {
	Auth        json.RawMessage `json:"auth"`
	DisplayName json.RawMessage `json:"display_name"`
	Metadata    json.RawMessage `json:"metadata"`
}

// staticBearer is a static_bearer auth object in a request. Token is the
// secret: it goes to the store and nowhere else.
type staticBearer struct {
	Type         *string         `json:"type"`
	Token        *string         `json:"token"`
	MCPServerURL json.RawMessage `json:"mcp_server_url"`
}

// authType reads an auth object's type, refusing the kinds corral cannot
// honour yet.
func authType(raw json.RawMessage) (string, error) {
	var head struct {
		Type *string `json:"type"`
	}
	if err := field(raw, "auth", &map[string]json.RawMessage{}); err != nil {
		return "", err
	}
	_ = json.Unmarshal(raw, &head)
	if head.Type == nil {
		return "", errdefs.InvalidArgument("auth.type is required")
	}
	switch *head.Type {
	case store.CredentialStaticBearer, store.CredentialMCPOAuth, store.CredentialModelAPIKey:
		return *head.Type, nil
	case "environment_variable":
		return "", refuse("credential.auth environment_variable", "auth.type")
	}
	return "", enumError("auth.type", *head.Type, []string{"static_bearer", "mcp_oauth", "environment_variable", "model_api_key"})
}

// bearerToken checks a secret at path (a token goes into an HTTP header
// or form): visible ASCII only, at most maxBearerToken. Messages never
// include it.
func bearerToken(tok *string, path string) (logging.Secret, error) {
	if tok == nil {
		return "", errdefs.InvalidArgument("%s is required", path)
	}
	if len(*tok) == 0 {
		return "", errdefs.InvalidArgument("%s must not be empty", path)
	}
	if len(*tok) > maxBearerToken {
		return "", errdefs.InvalidArgument("%s must be at most %d characters (got %d)", path, maxBearerToken, len(*tok))
	}
	for i := 0; i < len(*tok); i++ {
		if c := (*tok)[i]; c <= ' ' || c >= 0x7f {
			return "", errdefs.InvalidArgument("%s: character %d is not a visible ASCII character; it is sent in an HTTP request", path, i+1)
		}
	}
	return logging.Secret(*tok), nil
}

// mcpOAuth is an mcp_oauth auth object in a create or update request.
type mcpOAuth struct {
	Type         *string         `json:"type"`
	AccessToken  *string         `json:"access_token"`
	MCPServerURL json.RawMessage `json:"mcp_server_url"`
	ExpiresAt    json.RawMessage `json:"expires_at"`
	Refresh      json.RawMessage `json:"refresh"`
}

type oauthRefreshIn struct {
	ClientID          json.RawMessage `json:"client_id"`
	RefreshToken      *string         `json:"refresh_token"`
	TokenEndpoint     json.RawMessage `json:"token_endpoint"`
	TokenEndpointAuth json.RawMessage `json:"token_endpoint_auth"`
	Resource          json.RawMessage `json:"resource"`
	Scope             json.RawMessage `json:"scope"`
}

type tokenEndpointAuthIn struct {
	Type         *string `json:"type"`
	ClientSecret *string `json:"client_secret"`
}

// decodeExpiresAt reads an RFC 3339 expiry, which must be in the future.
func decodeExpiresAt(raw json.RawMessage, now time.Time) (*time.Time, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	var s string
	if err := field(raw, "auth.expires_at", &s); err != nil {
		return nil, err
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, errdefs.InvalidArgument("auth.expires_at: %q is not an RFC 3339 timestamp", truncate(s))
	}
	if !t.After(now) {
		return nil, errdefs.InvalidArgument("auth.expires_at must be in the future")
	}
	return &t, nil
}

func optString(raw json.RawMessage, path string, max int) (*string, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	var s string
	if err := field(raw, path, &s); err != nil {
		return nil, err
	}
	if err := checkLen(s, path, 1, max); err != nil {
		return nil, err
	}
	return &s, nil
}

// tokenEndpointAuth reads token_endpoint_auth: none, or a client secret
// sent by HTTP basic authentication or in the form. When update, the
// secret may be left out (kept).
func tokenEndpointAuth(raw json.RawMessage, update bool) (string, *logging.Secret, error) {
	const path = "auth.refresh.token_endpoint_auth"
	if !present(raw) || isNull(raw) {
		return "", nil, errdefs.InvalidArgument("%s is required", path)
	}
	var in tokenEndpointAuthIn
	if err := field(raw, path, &in); err != nil {
		return "", nil, err
	}
	if in.Type == nil {
		return "", nil, errdefs.InvalidArgument("%s.type is required", path)
	}
	switch *in.Type {
	case "none":
		if in.ClientSecret != nil {
			return "", nil, errdefs.InvalidArgument("%s: a client_secret does not go with type none", path)
		}
		return "none", nil, nil
	case "client_secret_basic", "client_secret_post":
		if in.ClientSecret == nil && update {
			return *in.Type, nil, nil
		}
		sec, err := bearerToken(in.ClientSecret, path+".client_secret")
		if err != nil {
			return "", nil, err
		}
		return *in.Type, &sec, nil
	}
	return "", nil, enumError(path+".type", *in.Type, []string{"none", "client_secret_basic", "client_secret_post"})
}

// checkURL checks a URL member the control plane will call.
func checkURL(raw json.RawMessage, path string) (string, error) {
	u, err := stringField(raw, path)
	if err != nil {
		return "", err
	}
	if err := checkLen(u, path, 1, maxMCPServerURL); err != nil {
		return "", err
	}
	if _, err := store.NormalizeMCPServerURL(u); err != nil {
		return "", errdefs.InvalidArgument("%s: %q is not an http or https URL without user information", path, truncate(u))
	}
	return u, nil
}

// decodeOAuthCreate reads an mcp_oauth create's auth into c and secrets.
func decodeOAuthCreate(raw json.RawMessage, c *store.Credential, secrets *store.CredentialSecrets, now time.Time) error {
	var a mcpOAuth
	if err := field(raw, "auth", &a); err != nil {
		return err
	}
	var err error
	if c.MCPServerURL, err = checkURL(a.MCPServerURL, "auth.mcp_server_url"); err != nil {
		return err
	}
	if secrets.Token, err = bearerToken(a.AccessToken, "auth.access_token"); err != nil {
		return err
	}
	if c.ExpiresAt, err = decodeExpiresAt(a.ExpiresAt, now); err != nil {
		return err
	}
	if !present(a.Refresh) || isNull(a.Refresh) {
		return nil
	}
	var in oauthRefreshIn
	if err := field(a.Refresh, "auth.refresh", &in); err != nil {
		return err
	}
	r := &store.OAuthRefresh{}
	if r.ClientID, err = stringField(in.ClientID, "auth.refresh.client_id"); err != nil {
		return err
	}
	if err := checkLen(r.ClientID, "auth.refresh.client_id", 1, maxClientID); err != nil {
		return err
	}
	if secrets.RefreshToken, err = bearerToken(in.RefreshToken, "auth.refresh.refresh_token"); err != nil {
		return err
	}
	if r.TokenEndpoint, err = checkURL(in.TokenEndpoint, "auth.refresh.token_endpoint"); err != nil {
		return err
	}
	var sec *logging.Secret
	if r.TokenEndpointAuth, sec, err = tokenEndpointAuth(in.TokenEndpointAuth, false); err != nil {
		return err
	}
	if sec != nil {
		secrets.ClientSecret = *sec
	}
	if r.Resource, err = optString(in.Resource, "auth.refresh.resource", maxMCPServerURL); err != nil {
		return err
	}
	if r.Scope, err = optString(in.Scope, "auth.refresh.scope", maxOAuthScope); err != nil {
		return err
	}
	c.Refresh = r
	return nil
}

// applyOAuthUpdate applies an mcp_oauth update's auth to cur: a new access
// token and expiry, and in refresh a new refresh token, scope or client
// secret. The server URL, client id and token endpoint cannot change.
func applyOAuthUpdate(raw json.RawMessage, cur store.Credential, now time.Time) (store.Credential, store.SecretsPatch, error) {
	var patch store.SecretsPatch
	var a mcpOAuth
	if err := field(raw, "auth", &a); err != nil {
		return cur, patch, err
	}
	if present(a.MCPServerURL) {
		return cur, patch, errdefs.InvalidArgument("auth.mcp_server_url cannot change after a credential is created; archive it and create another")
	}
	if a.AccessToken != nil {
		tok, err := bearerToken(a.AccessToken, "auth.access_token")
		if err != nil {
			return cur, patch, err
		}
		patch.Token = &tok
	}
	if present(a.ExpiresAt) {
		exp, err := decodeExpiresAt(a.ExpiresAt, now)
		if err != nil {
			return cur, patch, err
		}
		cur.ExpiresAt = exp
	}
	if !present(a.Refresh) || isNull(a.Refresh) {
		return cur, patch, nil
	}
	if cur.Refresh == nil {
		return cur, patch, errdefs.InvalidArgument("auth.refresh: the credential was created without a refresh configuration; archive it and create another")
	}
	var in oauthRefreshIn
	if err := field(a.Refresh, "auth.refresh", &in); err != nil {
		return cur, patch, err
	}
	if present(in.ClientID) || present(in.TokenEndpoint) || present(in.Resource) {
		return cur, patch, errdefs.InvalidArgument("auth.refresh: client_id, token_endpoint and resource cannot change after a credential is created; archive it and create another")
	}
	r := *cur.Refresh
	if in.RefreshToken != nil {
		tok, err := bearerToken(in.RefreshToken, "auth.refresh.refresh_token")
		if err != nil {
			return cur, patch, err
		}
		patch.RefreshToken = &tok
	}
	if present(in.Scope) {
		s, err := optString(in.Scope, "auth.refresh.scope", maxOAuthScope)
		if err != nil {
			return cur, patch, err
		}
		r.Scope = s
	}
	if present(in.TokenEndpointAuth) {
		typ, sec, err := tokenEndpointAuth(in.TokenEndpointAuth, true)
		if err != nil {
			return cur, patch, err
		}
		if typ != r.TokenEndpointAuth {
			return cur, patch, errdefs.InvalidArgument("auth.refresh.token_endpoint_auth.type: the credential uses %s, which cannot change; archive it and create another", r.TokenEndpointAuth)
		}
		patch.ClientSecret = sec
	}
	cur.Refresh = &r
	return cur, patch, nil
}

// decodeModelKeyCreate reads a model_api_key create's auth into c and
// secrets, under the node's policy.
func decodeModelKeyCreate(raw json.RawMessage, policy ModelCredentialPolicy, c *store.Credential, secrets *store.CredentialSecrets) error {
	if !policy.Allowed {
		return errdefs.InvalidArgument("auth.type model_api_key: this server's model client runs on no API key (it is the offline fake), so a tenant's key would not be used")
	}
	var a modelAPIKey
	if err := field(raw, "auth", &a); err != nil {
		return err
	}
	var err error
	if secrets.Token, err = bearerToken(a.APIKey, "auth.api_key"); err != nil {
		return err
	}
	if present(a.BaseURL) && !isNull(a.BaseURL) {
		u, err := stringField(a.BaseURL, "auth.base_url")
		if err != nil {
			return err
		}
		if err := checkLen(u, "auth.base_url", 1, maxMCPServerURL); err != nil {
			return err
		}
		if err := model.CheckBaseURL(u, policy.AllowLoopback); err != nil {
			return errdefs.InvalidArgument("auth.base_url: %v", err)
		}
		c.ModelBaseURL = &u
	}
	return nil
}

// decodeCredentialCreate validates a create request.
func decodeCredentialCreate(b []byte, policy ModelCredentialPolicy) (c store.Credential, secrets store.CredentialSecrets, err error) {
	var f credentialFields
	if err := decodeObject(b, "request body", &f); err != nil {
		return c, secrets, err
	}
	if !present(f.Auth) || isNull(f.Auth) {
		return c, secrets, errdefs.InvalidArgument("auth is required")
	}
	typ, err := authType(f.Auth)
	if err != nil {
		return c, secrets, err
	}
	c.AuthType = typ
	switch typ {
	case store.CredentialMCPOAuth:
		if err := decodeOAuthCreate(f.Auth, &c, &secrets, time.Now()); err != nil {
			return c, secrets, err
		}
	case store.CredentialModelAPIKey:
		if err := decodeModelKeyCreate(f.Auth, policy, &c, &secrets); err != nil {
			return c, secrets, err
		}
	default:
		var a staticBearer
		if err := field(f.Auth, "auth", &a); err != nil {
			return c, secrets, err
		}
		if c.MCPServerURL, err = checkURL(a.MCPServerURL, "auth.mcp_server_url"); err != nil {
			return c, secrets, err
		}
		if secrets.Token, err = bearerToken(a.Token, "auth.token"); err != nil {
			return c, secrets, err
		}
	}
	if c.DisplayName, err = credentialName(f.DisplayName); err != nil {
		return c, secrets, err
	}
	c.Metadata, err = metadataCreate(f.Metadata)
	return c, secrets, err
}

func credentialName(raw json.RawMessage) (*string, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	var s string
	if err := field(raw, "display_name", &s); err != nil {
		return nil, err
	}
	if err := checkLen(s, "display_name", 0, maxCredName); err != nil {
		return nil, err
	}
	return &s, nil
}

// applyCredentialUpdate applies an update to cur: display_name, a metadata
// patch and, in auth (whose type must be the credential's), a new token.
// The MCP server URL cannot change: archive the credential and make
// another.
func applyCredentialUpdate(b []byte, cur store.Credential) (store.Credential, store.SecretsPatch, error) {
	var f credentialFields
	var patch store.SecretsPatch
	if err := decodeObject(b, "request body", &f); err != nil {
		return cur, patch, err
	}
	if present(f.Auth) && !isNull(f.Auth) {
		typ, err := authType(f.Auth)
		if err != nil {
			return cur, patch, err
		}
		if typ != cur.AuthType {
			return cur, patch, errdefs.InvalidArgument("auth.type: the credential is %s and its type cannot change", cur.AuthType)
		}
		switch typ {
		case store.CredentialMCPOAuth:
			if cur, patch, err = applyOAuthUpdate(f.Auth, cur, time.Now()); err != nil {
				return cur, patch, err
			}
		case store.CredentialModelAPIKey:
			var a modelAPIKey
			if err := field(f.Auth, "auth", &a); err != nil {
				return cur, patch, err
			}
			if present(a.BaseURL) {
				return cur, patch, errdefs.InvalidArgument("auth.base_url cannot change after a credential is created; archive it and create another")
			}
			if a.APIKey != nil {
				s, err := bearerToken(a.APIKey, "auth.api_key")
				if err != nil {
					return cur, patch, err
				}
				patch.Token = &s
			}
		default:
			var a staticBearer
			if err := field(f.Auth, "auth", &a); err != nil {
				return cur, patch, err
			}
			if present(a.MCPServerURL) {
				return cur, patch, errdefs.InvalidArgument("auth.mcp_server_url cannot change after a credential is created; archive it and create another")
			}
			if a.Token != nil {
				s, err := bearerToken(a.Token, "auth.token")
				if err != nil {
					return cur, patch, err
				}
				patch.Token = &s
			}
		}
	}
	var err error
	if present(f.DisplayName) {
		if cur.DisplayName, err = credentialName(f.DisplayName); err != nil {
			return cur, patch, err
		}
	}
	cur.Metadata, err = metadataPatch(cur.Metadata, f.Metadata, false)
	return cur, patch, err
}

func (h *Handler) writeCredential(w http.ResponseWriter, r *http.Request, c store.Credential, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, credentialOut(c))
}

func (h *Handler) createCredential(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	c, secrets, err := decodeCredentialCreate(b, h.models)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	c, err = h.vaults().CreateCredential(r.Context(), r.PathValue("id"), c, secrets)
	h.writeCredential(w, r, c, err)
}

func (h *Handler) getCredential(w http.ResponseWriter, r *http.Request) {
	c, err := h.vaults().GetCredential(r.Context(), r.PathValue("id"), r.PathValue("credential_id"))
	h.writeCredential(w, r, c, err)
}

func (h *Handler) updateCredential(w http.ResponseWriter, r *http.Request) {
	b, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := decodeObject(b, "request body", &credentialFields{}); err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := h.vaults().UpdateCredential(r.Context(), r.PathValue("id"), r.PathValue("credential_id"), func(cur store.Credential) (store.Credential, store.SecretsPatch, error) {
		return applyCredentialUpdate(b, cur)
	})
	h.writeCredential(w, r, c, err)
}

func (h *Handler) archiveCredential(w http.ResponseWriter, r *http.Request) {
	if err := noBody(w, r); err != nil {
		h.fail(w, r, err)
		return
	}
	c, err := h.vaults().ArchiveCredential(r.Context(), r.PathValue("id"), r.PathValue("credential_id"))
	h.writeCredential(w, r, c, err)
}

func (h *Handler) deleteCredential(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("credential_id")
	if err := h.vaults().DeleteCredential(r.Context(), r.PathValue("id"), id); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "type": "vault_credential_deleted"})
}

func (h *Handler) listCredentials(w http.ResponseWriter, r *http.Request) {
	vaultID := r.PathValue("id")
	opts, err := listOptions(r, "credentials:"+vaultID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	cs, more, err := h.vaults().ListCredentials(r.Context(), vaultID, opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := page[credentialResponse]{Data: []credentialResponse{}}
	for _, c := range cs {
		out.Data = append(out.Data, credentialOut(c))
	}
	if more && len(cs) > 0 {
		last := cs[len(cs)-1]
		out.NextPage = keyCursor("credentials:"+vaultID, "desc", false, last.CreatedAt, last.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// decodeVaultIDs reads a session create's vault_ids: at most
// maxSessionVaults distinct ids. That each names an active vault of the
// tenant is checked in the transaction that stores the session.
func decodeVaultIDs(raw json.RawMessage) ([]string, error) {
	if !present(raw) || isNull(raw) {
		return nil, nil
	}
	var ids []string
	if err := field(raw, "vault_ids", &ids); err != nil {
		return nil, err
	}
	if len(ids) > maxSessionVaults {
		return nil, errdefs.InvalidArgument("vault_ids has %d entries; at most %d are allowed", len(ids), maxSessionVaults)
	}
	seen := map[string]bool{}
	for i, id := range ids {
		if !validID(id) {
			return nil, errdefs.InvalidArgument("vault_ids[%d]: %q is not the id of a vault", i, truncate(id))
		}
		if seen[id] {
			return nil, errdefs.InvalidArgument("vault_ids[%d]: vault %s is named twice", i, id)
		}
		seen[id] = true
	}
	return ids, nil
}
