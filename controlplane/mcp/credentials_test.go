package mcp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/mcp"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/test/mcpserver"
)

// tokens is a Credentials with one token per (session, URL).
type tokens struct {
	by  map[[2]string]string
	err error
}

func (c tokens) CredentialFor(_ context.Context, sessionID, serverURL string) (mcp.Credential, bool, error) {
	if c.err != nil {
		return mcp.Credential{}, false, c.err
	}
	t, ok := c.by[[2]string{sessionID, serverURL}]
	return mcp.Credential{Token: logging.Secret(t)}, ok, nil
}

// A session's bearer token reaches the server it is for, and a server
// that requires it refuses the session that has none; another server never
// sees it.
func TestBearerCredential(t *testing.T) {
	s := mcpserver.New()
	s.RequireBearer("s3cret-token")
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	var mu sync.Mutex
	var otherAuth []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		otherAuth = append(otherAuth, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "no", http.StatusNotFound)
	}))
	t.Cleanup(other.Close)

	srv := agentloop.MCPServer{Type: "url", Name: "calc", URL: hs.URL + "/mcp"}
	c := &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true, Credentials: tokens{by: map[[2]string]string{
		{"sesn_with", srv.URL}: "s3cret-token",
	}}}
	ctx := context.Background()
	tools, err := c.ListTools(ctx, "sesn_with", srv)
	if err != nil || len(tools) != 3 {
		t.Fatalf("with the credential: %d tools, %v", len(tools), err)
	}
	res, err := c.CallTool(ctx, "sesn_with", srv, "add", []byte(`{"a":2,"b":3}`))
	if err != nil || res.IsError || res.Content[0].Text != "5" {
		t.Fatalf("call with the credential: %+v, %v", res, err)
	}
	if s.Refused() != 0 {
		t.Fatalf("the server refused %d requests that carried the token", s.Refused())
	}
	if _, err := c.ListTools(ctx, "sesn_without", srv); !errors.Is(err, agentloop.ErrMCPAuthentication) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a session without the credential: %v, want ErrMCPAuthentication", err)
	}
	if s.Refused() == 0 {
		t.Fatal("the server refused nothing")
	}
	// The token is for its URL only.
	_, _ = c.ListTools(ctx, "sesn_with", agentloop.MCPServer{Type: "url", Name: "other", URL: other.URL + "/mcp"})
	mu.Lock()
	defer mu.Unlock()
	for _, a := range otherAuth {
		if a != "" {
			t.Errorf("another server got Authorization %q", a)
		}
	}
	if len(otherAuth) == 0 {
		t.Fatal("the other server saw no request")
	}
}

// A failure to read credentials is reported without its detail.
func TestCredentialErrorHidesDetail(t *testing.T) {
	c := &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true, Credentials: tokens{err: errors.New("opening the data key of tenant t: wrong seal key")}}
	_, err := c.ListTools(context.Background(), "sesn_1", agentloop.MCPServer{Type: "url", Name: "x", URL: "http://127.0.0.1:1/mcp"})
	if err == nil || strings.Contains(err.Error(), "seal") || !strings.Contains(err.Error(), "credentials could not be read") {
		t.Fatalf("err = %v", err)
	}
}

// By default the client dials no loopback, private or link-local address.
func TestPrivateDestinationsRefused(t *testing.T) {
	s := mcpserver.New()
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	c := &mcp.Client{Timeout: 20 * time.Second}
	for _, u := range []string{hs.URL, "http://169.254.169.254/mcp", "http://10.0.0.1:1/mcp", "http://[::1]:1/mcp", "http://0.0.0.0:1/mcp"} {
		_, err := c.ListTools(context.Background(), "sesn_1", agentloop.MCPServer{Type: "url", Name: "x", URL: u})
		if err == nil || !strings.Contains(err.Error(), "not allowed") {
			t.Errorf("%s: %v, want refused", u, err)
		}
	}
	if s.Calls("add") != 0 {
		t.Fatal("reached")
	}
}

// oauthCred is a Credentials holding one mcp_oauth credential in memory.
type oauthCred struct {
	mu    sync.Mutex
	cred  mcp.Credential
	saves int
}

func (o *oauthCred) CredentialFor(context.Context, string, string) (mcp.Credential, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.cred
	if c.Refresh != nil {
		r := *c.Refresh
		r.Save = func(_ context.Context, tok, rt logging.Secret, exp *time.Time) (bool, error) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.saves++
			o.cred.Token, o.cred.ExpiresAt = tok, exp
			if rt != "" {
				o.cred.Refresh.RefreshToken = rt
			}
			return true, nil
		}
		c.Refresh = &r
	}
	return c, true, nil
}

// An mcp_oauth token about to expire is refreshed at its token endpoint
// (client_secret_basic, the refresh token in the form), the new one is
// sent and saved, and the next operation uses it without refreshing.
func TestOAuthRefresh(t *testing.T) {
	s := mcpserver.New()
	s.RequireBearer("at-new")
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	var mu sync.Mutex
	var grants []string
	fail := false
	tokenEP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, secret, _ := r.BasicAuth()
		_ = r.ParseForm()
		mu.Lock()
		grants = append(grants, r.PostForm.Get("grant_type")+" "+r.PostForm.Get("refresh_token")+" "+id+":"+secret+" "+r.PostForm.Get("scope"))
		f := fail
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if f || r.PostForm.Get("refresh_token") != "rt-old" || id != "cid" || secret != "csecret" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		_, _ = w.Write([]byte(`{"access_token":"at-new","token_type":"Bearer","expires_in":3600,"refresh_token":"rt-new"}`))
	}))
	t.Cleanup(tokenEP.Close)

	soon := time.Now().Add(10 * time.Second)
	creds := &oauthCred{cred: mcp.Credential{Token: "at-old", ExpiresAt: &soon, Refresh: &mcp.Refresh{
		TokenEndpoint: tokenEP.URL + "/token", ClientID: "cid", AuthMethod: "client_secret_basic", ClientSecret: "csecret", RefreshToken: "rt-old", Scope: "tools",
	}}}
	c := &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true, Credentials: creds}
	srv := agentloop.MCPServer{Type: "url", Name: "calc", URL: hs.URL + "/mcp"}
	if _, err := c.ListTools(context.Background(), "sesn_1", srv); err != nil {
		t.Fatalf("ListTools with an expiring token: %v", err)
	}
	if _, err := c.ListTools(context.Background(), "sesn_1", srv); err != nil {
		t.Fatalf("ListTools with the refreshed token: %v", err)
	}
	mu.Lock()
	if len(grants) != 1 || grants[0] != "refresh_token rt-old cid:csecret tools" {
		t.Fatalf("token endpoint requests %q, want one refresh", grants)
	}
	mu.Unlock()
	creds.mu.Lock()
	if creds.saves != 1 || creds.cred.Token != "at-new" || creds.cred.Refresh.RefreshToken != "rt-new" || time.Until(*creds.cred.ExpiresAt) < 50*time.Minute {
		t.Fatalf("saved %d times: token %v, expires %v", creds.saves, creds.cred.Token == "at-new", creds.cred.ExpiresAt)
	}
	// Expiring again, with an endpoint that refuses: a clear error
	// naming the OAuth error, and no secret in it.
	creds.cred.ExpiresAt = &soon
	creds.mu.Unlock()
	mu.Lock()
	fail = true
	mu.Unlock()
	_, err := c.ListTools(context.Background(), "sesn_1", srv)
	if err == nil || !strings.Contains(err.Error(), "invalid_grant") || strings.Contains(err.Error(), "rt-new") || strings.Contains(err.Error(), "csecret") {
		t.Fatalf("refusing endpoint: %v", err)
	}
}

// A refreshable token the server refuses before its expiry (revoked,
// rotated) is refreshed once and the operation tried again; one that
// cannot be refreshed is an authentication error at once.
func TestOAuthRefreshOnRefusal(t *testing.T) {
	s := mcpserver.New()
	s.RequireBearer("at-new")
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	var mu sync.Mutex
	refreshes := 0
	tokenEP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		refreshes++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"access_token":"at-new","token_type":"bearer"}`))
	}))
	t.Cleanup(tokenEP.Close)
	later := time.Now().Add(time.Hour)
	creds := &oauthCred{cred: mcp.Credential{Token: "at-revoked", ExpiresAt: &later, Refresh: &mcp.Refresh{
		TokenEndpoint: tokenEP.URL, ClientID: "cid", AuthMethod: "none", RefreshToken: "rt",
	}}}
	c := &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true, Credentials: creds}
	srv := agentloop.MCPServer{Type: "url", Name: "calc", URL: hs.URL}
	res, err := c.CallTool(context.Background(), "sesn_1", srv, "add", []byte(`{"a":1,"b":1}`))
	if err != nil || res.Content[0].Text != "2" {
		t.Fatalf("CallTool with a revoked token: %+v, %v", res, err)
	}
	mu.Lock()
	if refreshes != 1 {
		t.Fatalf("%d refreshes, want 1", refreshes)
	}
	mu.Unlock()
	if s.Calls("add") != 1 {
		t.Fatalf("add ran %d times", s.Calls("add"))
	}
	// Without a refresh configuration: refused, no retry.
	plain := &mcp.Client{Timeout: 20 * time.Second, AllowPrivateNetworks: true, Credentials: tokens{by: map[[2]string]string{{"sesn_1", srv.URL}: "at-revoked"}}}
	if _, err := plain.ListTools(context.Background(), "sesn_1", srv); !errors.Is(err, agentloop.ErrMCPAuthentication) {
		t.Fatalf("a refused static token: %v", err)
	}
}
