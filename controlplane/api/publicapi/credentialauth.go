package publicapi

// A vault credential's auth object, decoded and validated member by
// member for a create or an update: static_bearer, mcp_oauth (with its
// refresh settings), model_api_key and environment_variable
// (credentialenv.go). Secrets leave here only as
// logging.Secret, for the store to seal.

import (
	"encoding/json"
	"time"

	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

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
	case store.CredentialStaticBearer, store.CredentialMCPOAuth, store.CredentialModelAPIKey, store.CredentialEnvironmentVariable:
		return *head.Type, nil
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
	case store.CredentialEnvironmentVariable:
		if err := decodeEnvCreate(f.Auth, &c, &secrets); err != nil {
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
		case store.CredentialEnvironmentVariable:
			if cur, patch, err = applyEnvUpdate(f.Auth, cur); err != nil {
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
