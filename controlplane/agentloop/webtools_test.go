package agentloop

import (
	"encoding/json"
	"testing"
)

// A stored agent's web tool options reach the model's tool list; a web
// tool without options gets none, and one under always_ask is not offered.
func TestWebToolOptionsReachTheModel(t *testing.T) {
	var a Agent
	spec := `{"model":{"id":"m"},"tools":[{"type":"agent_toolset_20260401","default_config":{"permission_policy":{"type":"always_allow"}},"configs":[
		{"name":"web_fetch","allowed_domains":["docs.example.com"],"blocked_domains":null,"max_content_tokens":5000,"url_sources":null},
		{"name":"web_search","allowed_domains":null,"blocked_domains":null,"user_location":null}]}]}`
	if err := json.Unmarshal([]byte(spec), &a); err != nil {
		t.Fatal(err)
	}
	table, err := resolveTools(a, DefaultExecLimits)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tool := range table.forModel {
		switch tool.Name {
		case "web_fetch":
			if o := tool.Web; o == nil || len(o.AllowedDomains) != 1 || o.AllowedDomains[0] != "docs.example.com" || o.MaxContentTokens != 5000 || o.BlockedDomains != nil {
				t.Errorf("web_fetch options %+v", tool.Web)
			}
		case "web_search":
			if tool.Web != nil {
				t.Errorf("web_search, set with nothing but nulls, has options %+v", tool.Web)
			}
		}
		seen[tool.Name] = true
	}
	if !seen["web_fetch"] || !seen["web_search"] {
		t.Errorf("the model is offered %v", seen)
	}
}
