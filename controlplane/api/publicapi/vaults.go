package publicapi

import (
	"encoding/json"
	"net/http"

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
// A credential's secret (auth.token) is write-only: no response carries it,
// no error message repeats it, and the store keeps it only as ciphertext
// (controlplane/store/datakeys.go). static_bearer is the only kind corral
// honours: the control plane's MCP client sends it as the Authorization
// bearer to its mcp_server_url, for sessions that name its vault in
// vault_ids. environment_variable and mcp_oauth are refused (see
// unsupportedFields).

// Bounds, as the Managed Agents API documents them.
const (
	maxVaultName     = 255
	maxCredName      = 255
	maxBearerToken   = 8192
	maxMCPServerURL  = 2047
	maxSessionVaults = 20
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

// credentialAuth is a credential's auth object as responses carry it: its
// non-secret fields only.
type credentialAuth struct {
	Type         string `json:"type"`
	MCPServerURL string `json:"mcp_server_url"`
}

type credentialResponse struct {
	Type        string            `json:"type"`
	ID          string            `json:"id"`
	VaultID     string            `json:"vault_id"`
	DisplayName *string           `json:"display_name"`
	Auth        credentialAuth    `json:"auth"`
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
	return credentialResponse{Type: "vault_credential", ID: c.ID, VaultID: c.VaultID, DisplayName: c.DisplayName,
		Auth:     credentialAuth{Type: c.AuthType, MCPServerURL: c.MCPServerURL},
		Metadata: c.Metadata, CreatedAt: ts(c.CreatedAt), UpdatedAt: ts(c.UpdatedAt), ArchivedAt: tsPtr(c.ArchivedAt)}
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
	case store.CredentialStaticBearer:
		return *head.Type, nil
	case "environment_variable":
		return "", refuse("credential.auth environment_variable", "auth.type")
	case "mcp_oauth":
		return "", refuse("credential.auth mcp_oauth", "auth.type")
	}
	return "", enumError("auth.type", *head.Type, []string{"static_bearer", "mcp_oauth", "environment_variable"})
}

// bearerToken checks a static_bearer token: it goes into an HTTP header,
// so it is visible ASCII only. Messages never include it.
func bearerToken(tok *string) (logging.Secret, error) {
	if tok == nil {
		return "", errdefs.InvalidArgument("auth.token is required")
	}
	if len(*tok) == 0 {
		return "", errdefs.InvalidArgument("auth.token must not be empty")
	}
	if len(*tok) > maxBearerToken {
		return "", errdefs.InvalidArgument("auth.token must be at most %d characters (got %d)", maxBearerToken, len(*tok))
	}
	for i := 0; i < len(*tok); i++ {
		if c := (*tok)[i]; c <= ' ' || c >= 0x7f {
			return "", errdefs.InvalidArgument("auth.token: character %d is not a visible ASCII character; a bearer token is sent in an HTTP header", i+1)
		}
	}
	return logging.Secret(*tok), nil
}

// decodeCredentialCreate validates a create request.
func decodeCredentialCreate(b []byte) (store.Credential, logging.Secret, error) {
	var f credentialFields
	var c store.Credential
	if err := decodeObject(b, "request body", &f); err != nil {
		return c, "", err
	}
	if !present(f.Auth) || isNull(f.Auth) {
		return c, "", errdefs.InvalidArgument("auth is required")
	}
	typ, err := authType(f.Auth)
	if err != nil {
		return c, "", err
	}
	var a staticBearer
	if err := field(f.Auth, "auth", &a); err != nil {
		return c, "", err
	}
	u, err := stringField(a.MCPServerURL, "auth.mcp_server_url")
	if err != nil {
		return c, "", err
	}
	if err := checkLen(u, "auth.mcp_server_url", 1, maxMCPServerURL); err != nil {
		return c, "", err
	}
	if _, err := store.NormalizeMCPServerURL(u); err != nil {
		return c, "", errdefs.InvalidArgument("auth.%s", err.Error())
	}
	secret, err := bearerToken(a.Token)
	if err != nil {
		return c, "", err
	}
	c.AuthType, c.MCPServerURL = typ, u
	if c.DisplayName, err = credentialName(f.DisplayName); err != nil {
		return c, "", err
	}
	c.Metadata, err = metadataCreate(f.Metadata)
	return c, secret, err
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
func applyCredentialUpdate(b []byte, cur store.Credential) (store.Credential, *logging.Secret, error) {
	var f credentialFields
	if err := decodeObject(b, "request body", &f); err != nil {
		return cur, nil, err
	}
	var secret *logging.Secret
	if present(f.Auth) && !isNull(f.Auth) {
		typ, err := authType(f.Auth)
		if err != nil {
			return cur, nil, err
		}
		if typ != cur.AuthType {
			return cur, nil, errdefs.InvalidArgument("auth.type: the credential is %s and its type cannot change", cur.AuthType)
		}
		var a staticBearer
		if err := field(f.Auth, "auth", &a); err != nil {
			return cur, nil, err
		}
		if present(a.MCPServerURL) {
			return cur, nil, errdefs.InvalidArgument("auth.mcp_server_url cannot change after a credential is created; archive it and create another")
		}
		if a.Token != nil {
			s, err := bearerToken(a.Token)
			if err != nil {
				return cur, nil, err
			}
			secret = &s
		}
	}
	var err error
	if present(f.DisplayName) {
		if cur.DisplayName, err = credentialName(f.DisplayName); err != nil {
			return cur, nil, err
		}
	}
	cur.Metadata, err = metadataPatch(cur.Metadata, f.Metadata, false)
	return cur, secret, err
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
	c, secret, err := decodeCredentialCreate(b)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	c, err = h.vaults().CreateCredential(r.Context(), r.PathValue("id"), c, secret)
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
	c, err := h.vaults().UpdateCredential(r.Context(), r.PathValue("id"), r.PathValue("credential_id"), func(cur store.Credential) (store.Credential, *logging.Secret, error) {
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
