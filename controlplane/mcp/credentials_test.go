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

func (c tokens) BearerFor(_ context.Context, sessionID, serverURL string) (logging.Secret, bool, error) {
	if c.err != nil {
		return "", false, c.err
	}
	t, ok := c.by[[2]string{sessionID, serverURL}]
	return logging.Secret(t), ok, nil
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
	if _, err := c.ListTools(ctx, "sesn_without", srv); err == nil {
		t.Fatal("a session without the credential listed the tools")
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
