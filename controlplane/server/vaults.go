package server

import (
	"context"
	"time"

	"corral.dev/corral/controlplane/mcp"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/logging"
)

// vaultCredentials gives the MCP client a session's credentials from the
// store's vaults, and stores the tokens it refreshes.
type vaultCredentials struct{ vaults store.Vaults }

var _ mcp.Credentials = vaultCredentials{}

func (v vaultCredentials) CredentialFor(ctx context.Context, sessionID, serverURL string) (mcp.Credential, bool, error) {
	sc, ok, err := v.vaults.CredentialFor(ctx, sessionID, serverURL)
	if err != nil || !ok {
		return mcp.Credential{}, false, err
	}
	out := mcp.Credential{Token: sc.Secrets.Token, ExpiresAt: sc.ExpiresAt}
	if r := sc.Refresh; r != nil && sc.AuthType == store.CredentialMCPOAuth {
		out.Refresh = &mcp.Refresh{
			TokenEndpoint: r.TokenEndpoint, ClientID: r.ClientID, AuthMethod: r.TokenEndpointAuth,
			ClientSecret: sc.Secrets.ClientSecret, RefreshToken: sc.Secrets.RefreshToken,
			Resource: deref(r.Resource), Scope: deref(r.Scope),
			Save: func(ctx context.Context, tok, rt logging.Secret, exp *time.Time) (bool, error) {
				return v.vaults.StoreRefreshed(ctx, sc, tok, rt, exp)
			},
		}
	}
	return out, true, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
