// Package mcp is the control plane's client of MCP servers, the agent
// loop's MCP port: it lists a server's tools and calls them over Streamable
// HTTP with the official Go MCP SDK. Calls go from the control plane, never
// from a sandbox. Each operation opens its own MCP session and closes it, so
// nothing is held between a session's turns (or across a failover).
//
// Credentials: when the session names vaults (vault_ids) holding an active
// static_bearer or mcp_oauth credential for the server's URL (compared
// normalized; see store.NormalizeMCPServerURL), the client sends its token
// as "Authorization: Bearer ..." on requests to that endpoint only: never
// to another URL, a redirect's target included. The token is read for each
// operation (an archived credential stops at once) and is never logged or
// put in an error. An mcp_oauth access token that expires within a minute
// is first refreshed at the credential's token endpoint (refresh.go), and
// the new one stored for the next operation; one the server refuses (401 or
// 403) before its expiry is refreshed once and the operation tried again.
// A refusal that stands is wrapped in agentloop.ErrMCPAuthentication.
//
// Destinations: MCP server URLs are the tenant's, and the control plane is
// inside the operator's network, so unless AllowPrivateNetworks is set the
// client refuses to connect to loopback, private, link-local (cloud
// metadata), multicast and unspecified addresses, checked on the address
// actually dialled (a name that resolves to one is refused too).
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/netguard"
)

// DefaultTimeout bounds one operation (connect and list, or connect and
// call) when Client.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// Client reaches MCP servers.
type Client struct {
	// HTTP is the client requests go through; nil is a plain client whose
	// dialer refuses private destinations (see AllowPrivateNetworks). A
	// client given here dials as it likes.
	HTTP *http.Client
	// AllowPrivateNetworks lets the default client dial loopback, private
	// and link-local addresses (development and tests).
	AllowPrivateNetworks bool
	// Credentials, when set, gives the bearer token a session may send to
	// a server.
	Credentials Credentials
	// Timeout bounds one operation; zero is DefaultTimeout.
	Timeout time.Duration
	// Version is reported to servers as the client's version.
	Version string
	// Log receives what errors to the session leave out (optional).
	Log *slog.Logger
}

// Credentials find a session's credential for an MCP server (the server
// adapts the store's vaults).
type Credentials interface {
	// CredentialFor returns the credential session sessionID may use with
	// the server at serverURL; ok is false when it has none.
	CredentialFor(ctx context.Context, sessionID, serverURL string) (cred Credential, ok bool, err error)
}

// Credential is a bearer token for one MCP server.
type Credential struct {
	Token logging.Secret
	// ExpiresAt, when set, is when Token expires.
	ExpiresAt *time.Time
	// Refresh, when set, gets a new token (OAuth refresh_token grant).
	Refresh *Refresh
}

// Refresh is how to refresh a Credential's token.
type Refresh struct {
	TokenEndpoint string
	ClientID      string
	// AuthMethod is none, client_secret_basic or client_secret_post.
	AuthMethod   string
	ClientSecret logging.Secret
	RefreshToken logging.Secret
	Resource     string // optional
	Scope        string // optional
	// Save stores a refreshed token (and refresh token, when the endpoint
	// rotated it); saved is false when the credential changed since it
	// was read, and the client reads it again.
	Save func(ctx context.Context, token, refreshToken logging.Secret, expiresAt *time.Time) (saved bool, err error)
}

var _ agentloop.MCP = (*Client)(nil)

// errCredentials is what a session is told when its credentials could not
// be read; the detail goes to the log.
var errCredentials = errors.New("the session's vault credentials could not be read")

// connect opens an MCP session with srv. refused records whether the
// endpoint answered 401 or 403 (see authError); refreshable says whether
// the session's credential can be refreshed, and force refreshes it first.
func (c *Client) connect(ctx context.Context, sessionID string, srv agentloop.MCPServer, refused *atomic.Int32, force bool) (_ *sdk.ClientSession, refreshable bool, _ error) {
	if srv.Type != "" && srv.Type != "url" {
		return nil, false, fmt.Errorf("MCP server %s: type %q is not supported (only url)", srv.Name, srv.Type)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Transport: c.transport()}
	}
	ep, err := url.Parse(srv.URL)
	if err != nil {
		return nil, false, fmt.Errorf("MCP server %s: its URL does not parse", srv.Name)
	}
	var tok logging.Secret
	if c.Credentials != nil {
		t, r, err := c.token(ctx, hc, sessionID, srv, force)
		if err != nil {
			return nil, false, err
		}
		tok, refreshable = t, r
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	watched := *hc
	watched.Transport = &bearerTransport{base: base, endpoint: ep, token: tok, refused: refused}
	hc = &watched
	version := c.Version
	if version == "" {
		version = "dev"
	}
	client := sdk.NewClient(&sdk.Implementation{Name: "corral", Version: version}, nil)
	t := &sdk.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		return nil, refreshable, fmt.Errorf("connecting to %s: %w", srv.URL, err)
	}
	return cs, refreshable, nil
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// retryRefreshed runs op once and, when the server refused the session's
// credential and it can be refreshed (an OAuth token revoked or rotated
// before its expiry), refreshes it and runs op again. A refused request was
// not carried out, so running it again is safe.
func retryRefreshed[T any](op func(force bool) (T, bool, error)) (T, error) {
	out, refreshable, err := op(false)
	if refreshable && errors.Is(err, agentloop.ErrMCPAuthentication) {
		out, _, err = op(true)
	}
	return out, err
}

// ListTools implements agentloop.MCP.
func (c *Client) ListTools(ctx context.Context, sessionID string, srv agentloop.MCPServer) ([]agentloop.MCPTool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	return retryRefreshed(func(force bool) ([]agentloop.MCPTool, bool, error) { return c.listTools(ctx, sessionID, srv, force) })
}

func (c *Client) listTools(ctx context.Context, sessionID string, srv agentloop.MCPServer, force bool) ([]agentloop.MCPTool, bool, error) {
	var refused atomic.Int32
	cs, refreshable, err := c.connect(ctx, sessionID, srv, &refused, force)
	if err != nil {
		return nil, refreshable, authError(err, srv, &refused)
	}
	defer cs.Close()
	out := []agentloop.MCPTool{}
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, refreshable, authError(fmt.Errorf("listing tools: %w", err), srv, &refused)
		}
		schema, err := json.Marshal(t.InputSchema)
		if err != nil {
			return nil, false, fmt.Errorf("tool %s: input schema: %w", t.Name, err)
		}
		out = append(out, agentloop.MCPTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	return out, false, nil
}

// CallTool implements agentloop.MCP. A tool that fails, and an error the
// server answers with (an unknown tool, bad arguments), are results with
// IsError; an error is returned only when the server could not be asked.
func (c *Client) CallTool(ctx context.Context, sessionID string, srv agentloop.MCPServer, name string, input []byte) (agentloop.ToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	args := json.RawMessage(input)
	if len(input) == 0 {
		args = json.RawMessage(`{}`)
	}
	return retryRefreshed(func(force bool) (agentloop.ToolResult, bool, error) {
		return c.callTool(ctx, sessionID, srv, name, args, force)
	})
}

func (c *Client) callTool(ctx context.Context, sessionID string, srv agentloop.MCPServer, name string, args json.RawMessage, force bool) (agentloop.ToolResult, bool, error) {
	var refused atomic.Int32
	cs, refreshable, err := c.connect(ctx, sessionID, srv, &refused, force)
	if err != nil {
		return agentloop.ToolResult{}, refreshable, authError(err, srv, &refused)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		return agentloop.ToolResult{Content: text(fmt.Sprintf("MCP server %s refused the call: %s", srv.Name, rpcErr.Message)), IsError: true}, false, nil
	}
	if err != nil {
		return agentloop.ToolResult{}, refreshable, authError(fmt.Errorf("calling %s: %w", name, err), srv, &refused)
	}
	return agentloop.ToolResult{Content: blocks(res), IsError: res.IsError}, false, nil
}

// blocks turns an MCP result into the text blocks of agent.mcp_tool_result:
// text as it is, structured content as JSON, other content named.
func blocks(res *sdk.CallToolResult) []model.Block {
	var out []model.Block
	for _, c := range res.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			out = append(out, model.Block{Type: "text", Text: c.Text})
		case *sdk.ImageContent:
			out = append(out, model.Block{Type: "text", Text: fmt.Sprintf("[an image (%s, %d bytes) the server returned is not passed on]", c.MIMEType, len(c.Data))})
		case *sdk.AudioContent:
			out = append(out, model.Block{Type: "text", Text: fmt.Sprintf("[audio (%s, %d bytes) the server returned is not passed on]", c.MIMEType, len(c.Data))})
		default:
			b, _ := json.Marshal(c)
			out = append(out, model.Block{Type: "text", Text: string(b)})
		}
	}
	if len(out) == 0 && res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		out = append(out, model.Block{Type: "text", Text: string(b)})
	}
	if len(out) == 0 {
		out = text("(no content)")
	}
	return out
}

func text(s string) []model.Block { return []model.Block{{Type: "text", Text: s}} }

// bearerTransport adds the token (if any) to requests for endpoint, and to
// no other, and notes the endpoint's 401 and 403 answers in refused.
type bearerTransport struct {
	base     http.RoundTripper
	endpoint *url.URL
	token    logging.Secret
	refused  *atomic.Int32
}

func (t *bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL
	ours := u.Scheme == t.endpoint.Scheme && u.Host == t.endpoint.Host && u.Path == t.endpoint.Path
	if ours && t.token != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+t.token.Reveal())
	}
	resp, err := t.base.RoundTrip(req)
	if ours && err == nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
		t.refused.Store(int32(resp.StatusCode))
	}
	return resp, err
}

// authError marks err as the server refusing to authenticate the session
// when the endpoint answered 401 or 403.
func authError(err error, srv agentloop.MCPServer, refused *atomic.Int32) error {
	if code := refused.Load(); code != 0 && err != nil {
		return fmt.Errorf("%w: %s answered %d (add a credential for %s to a vault the session names, or update its token)", agentloop.ErrMCPAuthentication, srv.URL, code, srv.URL)
	}
	return err
}

// transport is the default client's: the default transport's settings,
// and a dialer that refuses private destinations unless they are allowed.
func (c *Client) transport() http.RoundTripper {
	return netguard.Transport(c.AllowPrivateNetworks, "MCP servers")
}
