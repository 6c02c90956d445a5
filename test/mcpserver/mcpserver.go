// Package mcpserver is a small MCP server built with the official Go MCP
// SDK, served over Streamable HTTP, for tests of corral's MCP toolsets:
//
//	add      {"a": 1, "b": 2}  -> "3"
//	echo     {"text": "hi"}    -> "hi"
//	fail     {}                -> a tool error (is_error) saying "the fail tool always fails"
//
// Calls counts every tool call it served, by tool name. RequireBearer makes
// it answer 401 to every request without "Authorization: Bearer <token>"
// (a server that needs a vault's static_bearer credential); Refused counts
// those.
package mcpserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Server is the test server.
type Server struct {
	handler http.Handler

	// mu guards calls, token and refused.
	mu      sync.Mutex
	calls   map[string]int
	token   string
	refused int
}

type addIn struct {
	A int `json:"a" jsonschema:"the first addend"`
	B int `json:"b" jsonschema:"the second addend"`
}

type echoIn struct {
	Text string `json:"text" jsonschema:"what to echo"`
}

type noIn struct{}

// New returns the server; serve it with ServeHTTP (e.g. httptest.NewServer).
func New() *Server {
	s := &Server{calls: map[string]int{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "corral-test", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "Add two integers."}, func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, any, error) {
		s.count("add")
		return text(strconv.Itoa(in.A + in.B)), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "Echo the text back."}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		s.count("echo")
		return text(in.Text), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "fail", Description: "Always fails."}, func(_ context.Context, _ *mcp.CallToolRequest, _ noIn) (*mcp.CallToolResult, any, error) {
		s.count("fail")
		return nil, nil, errors.New("the fail tool always fails")
	})
	s.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	return s
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func (s *Server) count(tool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[tool]++
}

// RequireBearer makes the server refuse requests that do not carry token
// as their bearer.
func (s *Server) RequireBearer(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
}

// Refused is how many requests were refused for a missing or wrong token.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	want := s.token
	ok := want == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+want)) == 1
	if !ok {
		s.refused++
	}
	s.mu.Unlock()
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="corral-test"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.handler.ServeHTTP(w, r)
}

// Calls returns how many times tool was called.
func (s *Server) Calls(tool string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[tool]
}
