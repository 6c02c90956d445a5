package publicapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// req is one request of TestUnsupportedFields. Its path and body may name
// {agent}, {env}, {session} and {event}, ids the test made, and {n}, a
// number unique to the request.
type req struct {
	method, path, body string
}

func agentReq(members string) req {
	return req{"POST", "/v1/agents", `{"name":"a","model":"m"` + members + `}`}
}

func agentUpdateReq(members string) req {
	return req{"POST", "/v1/agents/{agent}", `{` + members + `}`}
}

func overrides(members string) req {
	return req{"POST", "/v1/sessions", `{"environment_id":"{env}","agent":{"type":"agent_with_overrides","id":"{agent}"` + members + `}}`}
}

func sessionReq(members string) req {
	return req{"POST", "/v1/sessions", `{"environment_id":"{env}","agent":"{agent}"` + members + `}`}
}

func sessionUpdateReq(members string) req {
	return req{"POST", "/v1/sessions/{session}", `{` + members + `}`}
}

func eventReq(event string) req {
	return req{"POST", "/v1/sessions/{session}/events", `{"events":[` + event + `]}`}
}

func initialEvent(event string) req { return sessionReq(`,"initial_events":[` + event + `]`) }

func envReq(members string) req {
	return req{"POST", "/v1/environments", `{"name":"e{n}"` + members + `}`}
}

func envUpdate(members string) req { return req{"POST", "/v1/environments/{env}", `{` + members + `}`} }

// toolsetWith is an agent toolset whose configs hold config.
func toolsetWith(config string) string {
	return `,"tools":[{"type":"agent_toolset_20260401","configs":[` + config + `]}]`
}

// Every row of unsupportedFields is refused when set, on every route that
// takes it, with a 400 that names the field, and accepted at its neutral
// value, so that the official SDKs' default requests work.
func TestUnsupportedFields(t *testing.T) {
	a := setupWithEvents(t)
	ids := map[string]string{}
	ids["agent"] = a.ok("POST", "/v1/agents", map[string]any{"name": "base", "model": "m"})["id"].(string)
	ids["env"] = a.ok("POST", "/v1/environments", map[string]any{"name": "base"})["id"].(string)
	ids["session"] = a.ok("POST", "/v1/sessions", map[string]any{"agent": ids["agent"], "environment_id": ids["env"]})["id"].(string)
	sent := a.ok("POST", "/v1/sessions/"+ids["session"]+"/events", map[string]any{"events": []any{map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "hi"}}}}})
	ids["event"] = sent["data"].([]any)[0].(map[string]any)["id"].(string)
	ids["vault"] = a.ok("POST", "/v1/vaults", map[string]any{"display_name": "v"})["id"].(string)
	ids["credential"] = a.ok("POST", "/v1/vaults/"+ids["vault"]+"/credentials", map[string]any{"auth": map[string]any{"type": "static_bearer", "token": "t", "mcp_server_url": "https://m.example/mcp"}})["id"].(string)
	ids["envcredential"] = a.ok("POST", "/v1/vaults/"+ids["vault"]+"/credentials", map[string]any{"auth": map[string]any{"type": "environment_variable", "secret_name": "TOKEN", "secret_value": "s", "networking": map[string]any{"type": "limited", "allowed_hosts": []string{"a.example"}}}})["id"].(string)

	text := `{"type":"text","text":"t"}`
	image := `{"type":"image","source":{"type":"url","url":"https://x.example/a.png"}}`
	document := `{"type":"document","source":{"type":"text","data":"d","media_type":"text/plain"}}`
	search := `{"type":"search_result","source":"s","title":"t","content":[` + text + `]}`
	web := func(tool, option string) (set, neutral []req) {
		cfg := `{"name":"` + tool + `","` + option + `":`
		var v string
		switch option {
		case "allowed_domains", "blocked_domains":
			v = `["docs.example.com"]`
		case "max_content_tokens":
			v = `1000`
		case "url_sources":
			v = `{"user_input":"none"}`
		case "user_location":
			v = `{"type":"approximate","city":"Paris"}`
		}
		set = []req{agentReq(toolsetWith(cfg + v + `}`)), agentUpdateReq(toolsetWith(cfg + v + `}`)[1:]), overrides(toolsetWith(cfg + v + `}`)),
			sessionUpdateReq(`"agent":{` + toolsetWith(cfg + v + `}`)[1:] + `}`)}
		neutral = []req{agentReq(toolsetWith(cfg + `null}`)), sessionUpdateReq(`"agent":{` + toolsetWith(cfg + `null}`)[1:] + `}`)}
		if option == "url_sources" {
			neutral = append(neutral, agentReq(toolsetWith(cfg+`{"user_input":"all","client_tool_results":{"type":"all"}}}`)))
		}
		return set, neutral
	}
	type tc struct {
		set, neutral []req
		// uploads set the field in a multipart upload (POST /v1/files).
		uploads [][]part
		want    string // in the message; the row's Field when empty
	}
	cases := map[string]tc{
		"file.expires_in_seconds": {
			uploads: [][]part{
				{csvPart("a.csv", "a"), {name: "expires_in_seconds", noFilename: true, body: []byte("3600")}},
				{{name: "expires_in_seconds", noFilename: true, body: []byte("3600")}, csvPart("a.csv", "a")},
			},
		},
		"agent.model.effort": {
			set:     []req{agentUpdateReq(`"model":{"id":"m","effort":{"type":"low"}}`), overrides(`,"model":{"id":"m","effort":"xhigh"}`), {"POST", "/v1/agents", `{"name":"a","model":{"id":"m","effort":"max"}}`}},
			neutral: []req{{"POST", "/v1/agents", `{"name":"a","model":{"id":"m","effort":"high"}}`}, {"POST", "/v1/agents", `{"name":"a","model":{"id":"m","effort":{"type":"high"}}}`}, {"POST", "/v1/agents", `{"name":"a","model":{"id":"m","effort":null}}`}},
		},
		"agent.model.speed": {
			set:     []req{{"POST", "/v1/agents", `{"name":"a","model":{"id":"m","speed":"fast"}}`}, agentUpdateReq(`"model":{"id":"m","speed":"fast"}`), overrides(`,"model":{"id":"m","speed":"fast"}`)},
			neutral: []req{{"POST", "/v1/agents", `{"name":"a","model":{"id":"m","speed":"standard"}}`}, agentUpdateReq(`"model":{"id":"m","speed":"standard"}`)},
		},
		"agent.model.inference_geo": {
			set:     []req{{"POST", "/v1/agents", `{"name":"a","model":{"id":"m","inference_geo":"us"}}`}, overrides(`,"model":{"id":"m","inference_geo":"eu"}`)},
			neutral: []req{{"POST", "/v1/agents", `{"name":"a","model":{"id":"m","inference_geo":null}}`}, {"POST", "/v1/agents", `{"name":"a","model":{"id":"m","inference_geo":""}}`}},
		},
		"agent.execution_identity": {
			set:     []req{agentReq(`,"execution_identity":{"type":"aws_role","role_arn":"arn:aws:iam::1:role/r"}`), agentUpdateReq(`"execution_identity":{"type":"aws_role","role_arn":"arn:aws:iam::1:role/r"}`)},
			neutral: []req{agentReq(`,"execution_identity":{"type":"service_account"}`), agentReq(`,"execution_identity":null`)},
		},
		"agent.multiagent": {
			set:     []req{agentReq(`,"multiagent":{"type":"coordinator","agents":[]}`), agentUpdateReq(`"multiagent":{"type":"coordinator","agents":[]}`)},
			neutral: []req{agentReq(`,"multiagent":null`)},
		},
		"session update vault_ids": {
			set:     []req{sessionUpdateReq(`"vault_ids":["{vault}"]`)},
			neutral: []req{sessionReq(`,"vault_ids":[]`), sessionUpdateReq(`"vault_ids":[]`), sessionUpdateReq(`"vault_ids":null`)},
		},
		"credential.auth.networking unrestricted": {
			set: []req{
				{"POST", "/v1/vaults/{vault}/credentials", `{"auth":{"type":"environment_variable","secret_name":"API_KEY","secret_value":"v","networking":{"type":"unrestricted"}}}`},
				{"POST", "/v1/vaults/{vault}/credentials/{envcredential}", `{"auth":{"type":"environment_variable","networking":{"type":"unrestricted"}}}`},
			},
			neutral: []req{{"POST", "/v1/vaults/{vault}/credentials", `{"auth":{"type":"environment_variable","secret_name":"K{n}","secret_value":"v","networking":{"type":"limited","allowed_hosts":["a.example"]}}}`}},
		},
		"credential.auth.injection_location.body": {
			set: []req{
				{"POST", "/v1/vaults/{vault}/credentials", `{"auth":{"type":"environment_variable","secret_name":"API_KEY","secret_value":"v","networking":{"type":"limited","allowed_hosts":["a.example"]},"injection_location":{"body":true,"header":true}}}`},
				{"POST", "/v1/vaults/{vault}/credentials/{envcredential}", `{"auth":{"type":"environment_variable","injection_location":{"body":true}}}`},
			},
			neutral: []req{
				{"POST", "/v1/vaults/{vault}/credentials", `{"auth":{"type":"environment_variable","secret_name":"K{n}","secret_value":"v","networking":{"type":"limited","allowed_hosts":["a.example"]},"injection_location":{"body":false,"header":true}}}`},
				{"POST", "/v1/vaults/{vault}/credentials/{envcredential}", `{"auth":{"type":"environment_variable","injection_location":{"body":false}}}`},
			},
		},
		"user.message image or document source of type file": {
			set: []req{eventReq(`{"type":"user.message","content":[` + text + `,{"type":"image","source":{"type":"file","file_id":"file_1"}}]}`),
				eventReq(`{"type":"user.message","content":[{"type":"document","source":{"type":"file","file_id":"file_1"}}]}`),
				initialEvent(`{"type":"user.message","content":[{"type":"image","source":{"type":"file","file_id":"file_1"}}]}`)},
			neutral: []req{eventReq(`{"type":"user.message","content":[` + text + `,` + image + `]}`), eventReq(`{"type":"user.message","content":[` + document + `]}`),
				initialEvent(`{"type":"user.message","content":[` + image + `]}`)},
		},
		"user.custom_tool_result image, document or search_result block": {
			set: []req{eventReq(`{"type":"user.custom_tool_result","custom_tool_use_id":"{event}","content":[` + image + `]}`),
				eventReq(`{"type":"user.custom_tool_result","custom_tool_use_id":"{event}","content":[` + search + `]}`),
				eventReq(`{"type":"user.custom_tool_result","custom_tool_use_id":"{event}","content":[` + document + `]}`)},
			neutral: []req{eventReq(`{"type":"user.custom_tool_result","custom_tool_use_id":"{event}","content":[` + text + `],"is_error":true}`)},
		},
		"user.interrupt.session_thread_id": {
			set:     []req{eventReq(`{"type":"user.interrupt","session_thread_id":"sthr_1"}`)},
			neutral: []req{eventReq(`{"type":"user.interrupt"}`), eventReq(`{"type":"user.interrupt","session_thread_id":null}`)},
		},
		"user.define_outcome": {set: []req{eventReq(`{"type":"user.define_outcome","description":"d"}`)}},
		"system.message":      {set: []req{eventReq(`{"type":"system.message","content":[` + text + `]}`)}},
		"environment.config.networking": {
			set: []req{envReq(`,"config":{"type":"cloud","networking":{"type":"unrestricted"}}`),
				envUpdate(`"config":{"type":"cloud","networking":{"type":"limited","allow_package_managers":true}}`)},
			neutral: []req{envReq(`,"config":{"type":"cloud","networking":{"type":"limited","allowed_hosts":[],"allow_package_managers":false,"allow_mcp_servers":false}}`), envReq(`,"config":{"type":"cloud","networking":null}`),
				envReq(`,"config":{"type":"cloud","networking":{"type":"limited","allowed_hosts":["x.example"]}}`),
				envReq(`,"config":{"type":"cloud","networking":{"type":"limited","allow_mcp_servers":true}}`)},
			want: "config.networking",
		},
		"environment.config.packages": {
			set:     []req{envReq(`,"config":{"type":"cloud","packages":{"pip":["requests"]}}`), envUpdate(`"config":{"type":"cloud","packages":{"apt":["git"]}}`)},
			neutral: []req{envReq(`,"config":{"type":"cloud","packages":{"type":"packages","pip":[],"apt":[]}}`)},
			want:    "config.packages",
		},
		"environment.scope account": {
			set:     []req{envReq(`,"scope":"account"`)},
			neutral: []req{envReq(`,"scope":"organization"`), envReq(`,"scope":null`)},
			want:    "scope",
		},
	}
	// Of the web tools' options only url_sources is refused; the others
	// are sent to the model's provider (TestWebToolOptions).
	for _, opt := range []struct{ tool, option string }{
		{"web_fetch", "url_sources"},
	} {
		set, neutral := web(opt.tool, opt.option)
		cases[opt.tool+"."+opt.option] = tc{set: set, neutral: neutral}
	}

	n := 0
	fill := func(s string) string {
		n++
		s = strings.ReplaceAll(s, "{n}", fmt.Sprint(n))
		for k, v := range ids {
			s = strings.ReplaceAll(s, "{"+k+"}", v)
		}
		return s
	}
	for _, row := range unsupportedFields {
		t.Run(row.Field, func(t *testing.T) {
			a := &testAPI{t: t, url: a.url, store: a.store, db: a.db}
			c, ok := cases[row.Field]
			if !ok {
				t.Fatalf("no case for %q", row.Field)
			}
			delete(cases, row.Field)
			if len(c.set)+len(c.uploads) == 0 {
				t.Fatalf("no request sets %q", row.Field)
			}
			if (len(c.neutral) == 0) != (row.Neutral == "") {
				t.Fatalf("neutral %q, %d neutral requests", row.Neutral, len(c.neutral))
			}
			for _, r := range c.set {
				msg := a.fail(400, r.method, fill(r.path), fill(r.body))
				want := c.want
				if want == "" {
					want = row.Field + " is not supported by this server yet"
				}
				if !strings.Contains(msg, want) {
					t.Errorf("%s %s %s: message %q does not contain %q", r.method, r.path, r.body, msg, want)
				}
			}
			for _, parts := range c.uploads {
				r := a.upload("", parts...)
				if msg := r.errMsg(t); r.status != 400 || !strings.Contains(msg, row.Field+" is not supported by this server yet") {
					t.Errorf("upload: %d %q", r.status, msg)
				}
			}
			for _, r := range c.neutral {
				a.ok(r.method, fill(r.path), fill(r.body))
			}
		})
	}
	for field := range cases {
		t.Errorf("case %q has no row in unsupportedFields", field)
	}
}

// Objects stored before a field was refused report it neutral: it was never
// in force. Agent versions and new versions made from them, and sessions'
// agent snapshots.
func TestStoredUnsupportedFieldsReportedNeutral(t *testing.T) {
	a := setup(t, nil)
	agentID := a.ok("POST", "/v1/agents", map[string]any{"name": "old", "model": "m", "tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})["id"].(string)
	envID := a.ok("POST", "/v1/environments", map[string]any{"name": "e"})["id"].(string)
	sessionID := a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID})["id"].(string)

	// What an older release stored: every refused field set (web_fetch is
	// the toolset's seventh config).
	const old = `jsonb_set(%s || '{"skills":[{"type":"anthropic","skill_id":"pdf","version":"latest"}],
		"model":{"id":"m","effort":{"type":"max"},"speed":"fast","inference_geo":"us"},
		"execution_identity":{"type":"aws_role","role_arn":"arn:aws:iam::1:role/r"}}'::jsonb,
		'{tools,0,configs,6,url_sources}', '{"user_input":{"type":"none"}}')`
	a.sql(`UPDATE agent_versions SET spec = `+fmt.Sprintf(old, "spec")+` WHERE agent_id = $1`, agentID)
	a.sql(`UPDATE sessions SET agent = `+fmt.Sprintf(old, "agent")+` WHERE id = $1`, sessionID)
	if raw := a.ok("GET", "/v1/agents/"+agentID, nil); raw["version"] != 1.0 {
		t.Fatalf("agent = %v", raw)
	}

	check := func(what string, core map[string]any) {
		t.Helper()
		m := core["model"].(map[string]any)
		ei := core["execution_identity"].(map[string]any)
		if len(core["skills"].([]any)) != 0 || m["effort"].(map[string]any)["type"] != "high" || m["speed"] != "standard" || m["inference_geo"] != nil ||
			ei["type"] != "service_account" || ei["role_arn"] != nil {
			t.Errorf("%s reports refused fields: %v", what, core)
		}
		for _, c := range core["tools"].([]any)[0].(map[string]any)["configs"].([]any) {
			if c := c.(map[string]any); c["name"] == "web_fetch" && c["url_sources"] != nil {
				t.Errorf("%s reports web_fetch.url_sources: %v", what, c)
			}
		}
	}
	check("agent", a.ok("GET", "/v1/agents/"+agentID, nil))
	check("agent list", a.ok("GET", "/v1/agents", nil)["data"].([]any)[0].(map[string]any))
	check("new version", a.ok("POST", "/v1/agents/"+agentID, map[string]any{"system": "new"}))
	check("session", a.ok("GET", "/v1/sessions/"+sessionID, nil)["agent"].(map[string]any))
	check("session list", a.ok("GET", "/v1/sessions", nil)["data"].([]any)[0].(map[string]any)["agent"].(map[string]any))
	check("updated session", a.ok("POST", "/v1/sessions/"+sessionID, map[string]any{"agent": map[string]any{"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}}})["agent"].(map[string]any))
	// A session of the old version snapshots it neutral.
	check("new session", a.ok("POST", "/v1/sessions", map[string]any{"agent": map[string]any{"type": "agent", "id": agentID, "version": 1}, "environment_id": envID})["agent"].(map[string]any))
}

// A member an event type does not carry would be dropped, so it is refused
// (null aside), and so are members a text block does not have.
func TestClientEventForeignMembers(t *testing.T) {
	exists := func(string) error { return nil }
	for body, want := range map[string]string{
		`{"type":"user.message","content":[{"type":"text","text":"t"}],"tool_use_id":"sevt_1"}`:         "tool_use_id is not a member of user.message",
		`{"type":"user.interrupt","content":[{"type":"text","text":"t"}]}`:                              "content is not a member of user.interrupt",
		`{"type":"user.tool_confirmation","tool_use_id":"sevt_1","result":"allow","is_error":true}`:     "is_error is not a member of user.tool_confirmation",
		`{"type":"user.message","content":[{"type":"text","text":"t","citations":[]}]}`:                 `"citations" is not a known field`,
		`{"type":"user.custom_tool_result","custom_tool_use_id":"sevt_1","session_thread_id":"sthr_1"}`: "session_thread_id is not a member",
	} {
		_, err := validateClientEvent(json.RawMessage(body), "event", exists)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
	if _, err := validateClientEvent(json.RawMessage(`{"type":"user.message","content":[{"type":"text","text":"t"}],"tool_use_id":null}`), "event", exists); err != nil {
		t.Errorf("null foreign member: %v", err)
	}
}
