package server

import (
	"slices"
	"testing"
)

// The hosts allow_mcp_servers adds: the names of the agent's servers,
// once each, never an IP address or a URL that names no host.
func TestMCPServerHosts(t *testing.T) {
	agent := []byte(`{"mcp_servers":[
		{"type":"url","name":"a","url":"https://Docs.Example/mcp"},
		{"type":"url","name":"b","url":"https://docs.example:8443/other"},
		{"type":"url","name":"c","url":"http://10.0.0.1/mcp"},
		{"type":"url","name":"d","url":"http://[::1]:80/"},
		{"type":"url","name":"e","url":"not a url"},
		{"type":"url","name":"f","url":"https://tools.example/"}]}`)
	if got := mcpServerHosts(agent); !slices.Equal(got, []string{"docs.example", "tools.example"}) {
		t.Fatalf("mcpServerHosts = %v", got)
	}
	if got := mcpServerHosts([]byte(`not json`)); got != nil {
		t.Fatalf("a broken snapshot gave %v", got)
	}
	if got := withHosts([]string{"a.example", "docs.example"}, []string{"docs.example", "b.example"}); !slices.Equal(got, []string{"a.example", "docs.example", "b.example"}) {
		t.Fatalf("withHosts = %v", got)
	}
}
