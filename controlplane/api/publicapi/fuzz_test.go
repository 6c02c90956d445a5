package publicapi

import (
	"encoding/json"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
)

// FuzzDecode feeds arbitrary bodies to every request decoder. None may
// panic, and every rejection must be an invalid argument (a 400), never an
// internal error. Under plain `go test` only the seed corpus runs.
func FuzzDecode(f *testing.F) {
	seeds := []string{
		``, `null`, `[]`, `{}`, `{"name":`, `"x"`, `{"name":"a","model":"m"}`,
		`{"name":"a","model":{"id":"m","effort":{"type":"max"},"speed":"fast"},"tools":[{"type":"agent_toolset_20260401","default_config":{"enabled":false},"configs":[{"name":"web_fetch","url_sources":{"user_input":"none","client_tool_results":{"type":"only","tools":[{"name":"t"}]}},"allowed_domains":["a.com"],"max_content_tokens":5},{"name":"web_search","user_location":{"city":"x"}}]},{"type":"custom","name":"t","description":"d","input_schema":{"type":"object","properties":{},"required":["a"]}},{"type":"mcp_toolset","mcp_server_name":"s","configs":[{"name":"x","enabled":true}]}],"mcp_servers":[{"name":"s","url":"https://s"}],"skills":[{"type":"custom","skill_id":"skill_1","version":"2"}],"metadata":{"a":"b"}}`,
		`{"name":"a","model":{"id":"m","effort":"high","speed":"standard","inference_geo":null},"tools":[{"type":"agent_toolset_20260401","configs":[{"name":"web_fetch","url_sources":{"user_input":"all"},"allowed_domains":null}]}],"skills":[],"execution_identity":{"type":"service_account"},"multiagent":null}`,
		`{"version":1,"name":null,"tools":null,"metadata":{"a":null}}`,
		`{"name":"e","config":{"type":"cloud","networking":{"type":"limited","allowed_hosts":["h"]},"packages":{"pip":["x"]}},"scope":"organization"}`,
		`{"config":{"type":"self_hosted"},"metadata":{"a":""},"description":null}`,
		`{"title":"t","metadata":{"x":"y"},"agent":{"tools":[],"mcp_servers":null}}`,
		`[{"type":"user.message","content":[{"type":"text","text":"hi"}]},{"type":"user.define_outcome"}]`,
		`{"name":"a","model":"m","tools":[{"type":"agent_toolset_20260401","configs":[{"name":"bash","type":"edit"}]}]}`,
		`{"name":"\ud800","model":"m","metadata":{"":"x"}}`,
		`{"agent":{"type":"agent_with_overrides","id":"agent_x","version":2,"tools":[{"type":"mcp_toolset","mcp_server_name":"s"}],"mcp_servers":[{"name":"s","url":"http://s"}]},"environment_id":"env_x","title":"t","initial_events":[{"type":"user.message","content":[{"type":"text","text":"hi"}]}]}`,
		`{"agent":"agent_x","environment_id":"env_x","resources":[],"vault_ids":null,"budget":null}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	spec, _ := json.Marshal(agentSpec{agentCore: defaultCore(), Metadata: map[string]string{"k": "v"}})
	spec = mustResolve(f, spec)
	curAgent := store.Agent{ID: "agent_x", Version: 3, LatestVersion: 3, Name: "a", Spec: spec, CreatedAt: time.Now(), UpdatedAt: time.Now()}
	snap, _ := json.Marshal(sessionAgent{Type: "agent", ID: "agent_x", Version: 3, Name: "a", agentCore: mustCore(f, spec)})
	curSession := store.Session{ID: "sesn_x", Status: store.SessionIdle, Agent: snap, Metadata: map[string]string{"k": "v"}}
	curEnv := store.Environment{ID: "env_x", Name: "e", Config: json.RawMessage(`{"type":"self_hosted"}`), Scope: "organization", Metadata: map[string]string{}}

	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(what string, err error) {
			if err != nil && !errdefs.IsInvalidArgument(err) && !errdefs.IsConflict(err) {
				t.Fatalf("%s: %v is %v, not a client error", what, err, errdefs.KindOf(err))
			}
		}
		_, _, err := decodeAgentCreate(b)
		check("agent create", err)
		_, _, err = applyAgentUpdate(b, curAgent)
		check("agent update", err)
		_, err = applyEnvironment(b, store.Environment{}, true, false, nil)
		check("environment create", err)
		_, err = applyEnvironment(b, curEnv, false, true, nil)
		check("environment update", err)
		next, err := applySessionUpdate(b, curSession, nil)
		check("session update", err)
		if err == nil {
			if _, err := sessionUpdatedEvent(curSession, next); err != nil {
				t.Fatalf("session.updated event: %v", err)
			}
		}
		h := &Handler{events: &fakeEvents{}}
		c, err := h.decodeSessionCreate(b)
		check("session create", err)
		if err == nil {
			_, err = c.agent.snapshot(curAgent)
			check("session agent", err)
		}
		_, err = parseAgentRef(b)
		check("agent reference", err)
		_, err = decodeInitialEvents(b)
		check("initial events", err)
		_, err = decodeEnvConfig(b, true, nil)
		check("environment config", err)
		_, err = decodeTools(b)
		check("tools", err)
		_, err = decodeModel(b)
		check("model", err)
		_, err = metadataPatch(map[string]string{"a": "b"}, b, true)
		check("metadata patch", err)
	})
}

// mustResolve returns the spec as the decoders would store it.
func mustResolve(f *testing.F, spec []byte) []byte {
	var s agentSpec
	if err := json.Unmarshal(spec, &s); err != nil {
		f.Fatal(err)
	}
	s.Model = modelConfig{ID: "m", Effort: typedString{Type: "high"}, Speed: "standard"}
	out, _ := json.Marshal(s)
	return out
}

func mustCore(f *testing.F, spec []byte) agentCore {
	var s agentSpec
	if err := json.Unmarshal(spec, &s); err != nil {
		f.Fatal(err)
	}
	return s.agentCore
}
