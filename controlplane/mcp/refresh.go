package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/internal/logging"
)

// refreshEarly is how long before its expiry a token is refreshed: an
// operation that starts with less could see it expire midway.
const refreshEarly = time.Minute

// maxTokenResponse bounds what is read of a token endpoint's answer.
const maxTokenResponse = 64 << 10

// token returns the bearer session sessionID sends to srv ("" for none),
// refreshing an expiring OAuth token first, or any refreshable one when
// force; refreshable says whether it could be. Its errors are fit for the
// session to read.
func (c *Client) token(ctx context.Context, hc *http.Client, sessionID string, srv agentloop.MCPServer, force bool) (tok logging.Secret, refreshable bool, err error) {
	// A save that loses to another change reads the credential again;
	// twice is enough (the other change was a refresh or the tenant's).
	for range 2 {
		cred, ok, err := c.Credentials.CredentialFor(ctx, sessionID, srv.URL)
		if err != nil {
			c.logError("reading a session's MCP credential", sessionID, srv, err)
			return "", false, errCredentials
		}
		if !ok {
			return "", false, nil
		}
		if cred.Refresh == nil {
			return cred.Token, false, nil
		}
		if !force && (cred.ExpiresAt == nil || time.Until(*cred.ExpiresAt) > refreshEarly) {
			return cred.Token, true, nil
		}
		tok, rt, exp, err := refresh(ctx, hc, cred.Refresh)
		if err != nil {
			return "", true, fmt.Errorf("refreshing the OAuth token of the session's credential for %s: %w", srv.URL, err)
		}
		saved, err := cred.Refresh.Save(ctx, tok, rt, exp)
		if err != nil {
			// The new token works now; the next operation refreshes again.
			c.logError("storing a refreshed MCP token", sessionID, srv, err)
			return tok, true, nil
		}
		if saved {
			return tok, true, nil
		}
		force = false // another change won: its token is the fresh one
	}
	return "", true, errors.New("the session's credential changed while its OAuth token was refreshed; try again")
}

func (c *Client) logError(msg, sessionID string, srv agentloop.MCPServer, err error) {
	if c.Log != nil {
		c.Log.Error(msg, "session_id", sessionID, "mcp_server_name", srv.Name, "err", err)
	}
}

// tokenResponse is an OAuth token endpoint's answer (RFC 6749 5.1).
type tokenResponse struct {
	AccessToken  string      `json:"access_token"`
	TokenType    string      `json:"token_type"`
	ExpiresIn    json.Number `json:"expires_in"`
	RefreshToken string      `json:"refresh_token"`
	Error        string      `json:"error"`
}

// refresh runs the refresh_token grant (RFC 6749 6) at r's endpoint, with
// the client authenticated as r says (2.3.1), and returns the new access
// token, the new refresh token if the endpoint rotated it, and the expiry.
// Errors name the endpoint's status or OAuth error code, never a secret.
func refresh(ctx context.Context, hc *http.Client, r *Refresh) (logging.Secret, logging.Secret, *time.Time, error) {
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {r.RefreshToken.Reveal()}}
	if r.Resource != "" {
		form.Set("resource", r.Resource)
	}
	if r.Scope != "" {
		form.Set("scope", r.Scope)
	}
	switch r.AuthMethod {
	case "client_secret_post":
		form.Set("client_id", r.ClientID)
		form.Set("client_secret", r.ClientSecret.Reveal())
	case "client_secret_basic":
	default:
		form.Set("client_id", r.ClientID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.TokenEndpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return "", "", nil, errors.New("the token endpoint is not a URL")
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if r.AuthMethod == "client_secret_basic" {
		req.SetBasicAuth(url.QueryEscape(r.ClientID), url.QueryEscape(r.ClientSecret.Reveal()))
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return "", "", nil, fmt.Errorf("calling the token endpoint: %w", redactURL(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse+1))
	if err != nil {
		return "", "", nil, fmt.Errorf("reading the token endpoint's answer: %w", err)
	}
	if len(body) > maxTokenResponse {
		return "", "", nil, fmt.Errorf("the token endpoint's answer is larger than %d bytes", maxTokenResponse)
	}
	var tr tokenResponse
	jsonErr := json.Unmarshal(body, &tr)
	if resp.StatusCode != http.StatusOK {
		if jsonErr == nil && tr.Error != "" && len(tr.Error) <= 64 {
			return "", "", nil, fmt.Errorf("the token endpoint answered %d (%s)", resp.StatusCode, tr.Error)
		}
		return "", "", nil, fmt.Errorf("the token endpoint answered %d", resp.StatusCode)
	}
	if jsonErr != nil || tr.AccessToken == "" {
		return "", "", nil, errors.New("the token endpoint's answer holds no access_token")
	}
	if tr.TokenType != "" && !strings.EqualFold(tr.TokenType, "bearer") {
		return "", "", nil, fmt.Errorf("the token endpoint issued a %q token, not a bearer token", truncate(tr.TokenType))
	}
	if !headerSafe(tr.AccessToken) || (tr.RefreshToken != "" && !headerSafe(tr.RefreshToken)) {
		return "", "", nil, errors.New("the token endpoint issued a token that is not visible ASCII")
	}
	var exp *time.Time
	if tr.ExpiresIn != "" {
		secs, err := tr.ExpiresIn.Int64()
		if err != nil || secs <= 0 || secs > 10*365*24*3600 {
			return "", "", nil, errors.New("the token endpoint's expires_in is not a positive number of seconds")
		}
		t := start.Add(time.Duration(secs) * time.Second)
		exp = &t
	}
	return logging.Secret(tr.AccessToken), logging.Secret(tr.RefreshToken), exp, nil
}

// headerSafe reports whether a token can go in a header: visible ASCII,
// and not too long.
func headerSafe(s string) bool {
	if len(s) == 0 || len(s) > 8192 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// redactURL drops the URL from a client error (it is the tenant's, but the
// form it carried is not in it; the wrapped cause is what matters).
func redactURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
