package publicapi

import (
	"net/http"
	"strings"
	"testing"
)

// The web tools' options are checked and kept (the loop sends them to the
// model's provider: the model package's TestAnthropicWebToolOptions, and
// agentloop's TestWebToolOptionsReachTheModel).
func TestWebToolOptions(t *testing.T) {
	a := setup(t, nil)
	toolset := func(configs string) string {
		return `{"name":"w","model":"m","tools":[{"type":"agent_toolset_20260401","default_config":{"permission_policy":{"type":"always_allow"}},"configs":[` + configs + `]}]}`
	}
	r := a.do("POST", "/v1/agents", toolset(`{"name":"web_fetch","allowed_domains":["docs.example.com","api.example.org"],"max_content_tokens":5000},
		{"name":"web_search","blocked_domains":["spam.example","example.com/ads"],"user_location":{"type":"approximate","city":"Paris","country":"FR","timezone":"Europe/Paris"}}`))
	if r.status != http.StatusOK {
		t.Fatalf("an agent with web tool options: %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	got := string(a.do("GET", "/v1/agents/"+id, nil).body)
	for _, want := range []string{`"allowed_domains":["docs.example.com","api.example.org"]`, `"max_content_tokens":5000`, `"blocked_domains":["spam.example","example.com/ads"]`, `"city":"Paris"`, `"country":"FR"`} {
		if !strings.Contains(got, want) {
			t.Errorf("the agent reads back %s, without %s", got, want)
		}
	}
	for bad, want := range map[string]string{
		`{"name":"web_fetch","allowed_domains":["a.example"],"blocked_domains":["b.example"]}`: "not both",
		`{"name":"web_fetch","allowed_domains":[]}`:                                            "1 to 64",
		`{"name":"web_fetch","allowed_domains":["https://a.example"]}`:                         "without a scheme",
		`{"name":"web_fetch","allowed_domains":["a.example/docs"]}`:                            "port or path",
		`{"name":"web_search","allowed_domains":["a.example:8443"]}`:                           "without a scheme or port",
		`{"name":"web_fetch","allowed_domains":["a b.example"]}`:                               "not a plain host name",
		`{"name":"web_fetch","allowed_domains":"a.example"}`:                                   "list of domain names",
		`{"name":"web_fetch","max_content_tokens":0}`:                                          "1 to 1000000",
		`{"name":"web_fetch","max_content_tokens":1.5}`:                                        "whole number",
		`{"name":"web_fetch","user_location":{"type":"approximate"}}`:                          "not an option of the web_fetch tool",
		`{"name":"web_search","max_content_tokens":10}`:                                        "not an option of the web_search tool",
		`{"name":"web_search","user_location":{"type":"exact","city":"Paris"}}`:                "approximate",
		`{"name":"web_search","user_location":{"type":"approximate","country":"France"}}`:      "two-letter",
		`{"name":"web_search","user_location":{"type":"approximate","city":""}}`:               "printable",
		`{"name":"web_search","user_location":{"type":"approximate","planet":"Mars"}}`:         "planet",
		`{"name":"bash","allowed_domains":["a.example"]}`:                                      "not an option of the bash tool",
	} {
		r := a.do("POST", "/v1/agents", toolset(bad))
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), want) {
			t.Errorf("%s: %d %s, want a 400 saying %q", bad, r.status, r.body, want)
		}
	}
}
