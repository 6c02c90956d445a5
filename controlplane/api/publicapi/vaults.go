package publicapi

import (
	"encoding/json"
	"net/http"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
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
	if c.AuthType == store.CredentialEnvironmentVariable {
		auth = envOut(c)
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
