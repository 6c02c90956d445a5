// Package mcp is the control plane's client of MCP servers, the agent
// loop's MCP port: it lists a server's tools and calls them over Streamable
// HTTP with the official Go MCP SDK. Calls go from the control plane, never
// from a sandbox. Each operation opens its own MCP session and closes it, so
// nothing is held between a session's turns (or across a failover).
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
)

// DefaultTimeout bounds one operation (connect and list, or connect and
// call) when Client.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// Client reaches MCP servers.
type Client struct {
	// HTTP is the client requests go through; nil is a plain client.
	HTTP *http.Client
	// Timeout bounds one operation; zero is DefaultTimeout.
	Timeout time.Duration
	// Version is reported to servers as the client's version.
	Version string
}

var _ agentloop.MCP = (*Client)(nil)

func (c *Client) connect(ctx context.Context, srv agentloop.MCPServer) (*sdk.ClientSession, error) {
	if srv.Type != "" && srv.Type != "url" {
		return nil, fmt.Errorf("MCP server %s: type %q is not supported (only url)", srv.Name, srv.Type)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{}
	}
	version := c.Version
	if version == "" {
		version = "dev"
	}
	client := sdk.NewClient(&sdk.Implementation{Name: "corral", Version: version}, nil)
	t := &sdk.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", srv.URL, err)
	}
	return cs, nil
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// ListTools implements agentloop.MCP.
func (c *Client) ListTools(ctx context.Context, srv agentloop.MCPServer) ([]agentloop.MCPTool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	cs, err := c.connect(ctx, srv)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	out := []agentloop.MCPTool{}
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("listing tools: %w", err)
		}
		schema, err := json.Marshal(t.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("tool %s: input schema: %w", t.Name, err)
		}
		out = append(out, agentloop.MCPTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	return out, nil
}

// CallTool implements agentloop.MCP. A tool that fails, and an error the
// server answers with (an unknown tool, bad arguments), are results with
// IsError; an error is returned only when the server could not be asked.
func (c *Client) CallTool(ctx context.Context, srv agentloop.MCPServer, name string, input []byte) (agentloop.ToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	args := json.RawMessage(input)
	if len(input) == 0 {
		args = json.RawMessage(`{}`)
	}
	cs, err := c.connect(ctx, srv)
	if err != nil {
		return agentloop.ToolResult{}, err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		return agentloop.ToolResult{Content: text(fmt.Sprintf("MCP server %s refused the call: %s", srv.Name, rpcErr.Message)), IsError: true}, nil
	}
	if err != nil {
		return agentloop.ToolResult{}, fmt.Errorf("calling %s: %w", name, err)
	}
	return agentloop.ToolResult{Content: blocks(res), IsError: res.IsError}, nil
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
