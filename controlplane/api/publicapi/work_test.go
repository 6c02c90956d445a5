package publicapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// selfHostedFixtures makes an agent, a self_hosted environment with a
// session in it, and a cloud environment with a session.
func selfHostedFixtures(t *testing.T, a *testAPI) (envID, sessionID, cloudEnv, cloudSession string) {
	t.Helper()
	agentID, cloudEnv := fixtures(t, a)
	env := a.ok("POST", "/v1/environments", map[string]any{"name": "mine", "config": map[string]any{"type": "self_hosted"}})
	if b, _ := json.Marshal(env["config"]); string(b) != `{"type":"self_hosted"}` {
		t.Fatalf("config = %s", b)
	}
	envID = env["id"].(string)
	sessionID = a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID})["id"].(string)
	cloudSession = a.ok("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": cloudEnv})["id"].(string)
	return envID, sessionID, cloudEnv, cloudSession
}

func TestWorkQueueProtocol(t *testing.T) {
	a := setupWithEvents(t)
	envID, sessionID, cloudEnv, _ := selfHostedFixtures(t, a)
	work := "/v1/environments/" + envID + "/work"
	key := []string{"X-Test-Environment", envID}

	if st := a.ok("GET", work+"/stats", nil, key...); st["type"] != "work_queue_stats" || st["depth"] != 1.0 || st["pending"] != 0.0 || st["oldest_queued_at"] == nil {
		t.Fatalf("stats = %v", st)
	}
	// Bad input is a 400 that names it.
	for q, want := range map[string]string{
		"?block_ms=0":                  "block_ms",
		"?block_ms=soon":               "block_ms",
		"?reclaim_older_than_ms=-5":    "reclaim_older_than_ms",
		"?reclaim_older_than_ms=1e100": "reclaim_older_than_ms",
	} {
		if msg := a.fail(400, "GET", work+"/poll"+q, nil, key...); !strings.Contains(msg, want) {
			t.Errorf("poll%s: %q", q, msg)
		}
	}
	a.fail(400, "GET", work+"/poll", nil, append(key, "Anthropic-Worker-ID", "two words")...)
	if msg := a.fail(400, "GET", "/v1/environments/"+cloudEnv+"/work/poll", nil); !strings.Contains(msg, "self_hosted") {
		t.Errorf("cloud poll: %q", msg)
	}
	// Another tenant's environment, and another environment for an
	// environment key, are not found.
	a.fail(404, "GET", work+"/poll", nil, "X-Test-Tenant", "tenant_b")
	a.fail(404, "GET", "/v1/environments/"+cloudEnv+"/work/poll", nil, key...)

	it := a.ok("GET", work+"/poll?block_ms=999", nil, append(key, "Anthropic-Worker-ID", "w1")...)
	id := it["id"].(string)
	if d := it["data"].(map[string]any); it["type"] != "work" || it["state"] != "queued" || d["type"] != "session" || d["id"] != sessionID || it["environment_id"] != envID {
		t.Fatalf("polled %v", it)
	}
	// Handed out and not acked: the next poll (within reclaim) has nothing.
	if r := a.do("GET", work+"/poll", nil, key...); r.status != 200 || strings.TrimSpace(string(r.body)) != "null" {
		t.Fatalf("second poll: %d %s", r.status, r.body)
	}
	if st := a.ok("GET", work+"/stats", nil, key...); st["depth"] != 0.0 || st["pending"] != 1.0 || st["workers_polling"] != 1.0 {
		t.Fatalf("stats = %v", st)
	}
	// Unacknowledged past reclaim_older_than_ms: handed out again.
	a.sql(`UPDATE environment_work SET polled_at = now() - interval '1 minute' WHERE id = $1`, id)
	if again := a.ok("GET", work+"/poll?reclaim_older_than_ms=30000", nil, key...); again["id"] != id {
		t.Fatalf("reclaimed %v", again)
	}

	item := work + "/" + id
	if acked := a.ok("POST", item+"/ack", nil, key...); acked["state"] != "starting" || acked["acknowledged_at"] == nil {
		t.Fatalf("acked %v", acked)
	}
	a.fail(409, "POST", item+"/ack", nil, key...)
	a.fail(404, "POST", work+"/work_nope/ack", nil, key...)
	a.fail(404, "POST", item+"/ack", nil, "X-Test-Tenant", "tenant_b")

	// Heartbeats: NO_HEARTBEAT claims the lease, then each names the last.
	if msg := a.fail(400, "POST", item+"/heartbeat", nil, key...); !strings.Contains(msg, "expected_last_heartbeat") {
		t.Errorf("no expected: %q", msg)
	}
	a.fail(400, "POST", item+"/heartbeat?expected_last_heartbeat=NO_HEARTBEAT&desired_ttl_seconds=0", nil, key...)
	a.fail(400, "POST", item+"/heartbeat?expected_last_heartbeat=NO_HEARTBEAT", `{"x":1}`, key...)
	hb := a.ok("POST", item+"/heartbeat?expected_last_heartbeat=NO_HEARTBEAT", nil, key...)
	last, _ := hb["last_heartbeat"].(string)
	if hb["type"] != "work_heartbeat" || hb["lease_extended"] != true || hb["state"] != "active" || last == "" || hb["ttl_seconds"] != 120.0 {
		t.Fatalf("heartbeat %v", hb)
	}
	lost := a.do("POST", item+"/heartbeat?expected_last_heartbeat=NO_HEARTBEAT", nil, key...)
	if lost.status != 412 {
		t.Fatalf("stale heartbeat: %d %s", lost.status, lost.body)
	}
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Details struct {
				ErrorCode    string         `json:"error_code"`
				CurrentState map[string]any `json:"current_state"`
			} `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(lost.body, &body); err != nil || body.Error.Details.ErrorCode != "heartbeat_precondition_failed" ||
		body.Error.Details.CurrentState["state"] != "active" || body.Error.Details.CurrentState["last_heartbeat"] != last {
		t.Fatalf("412 body: %s", lost.body)
	}
	hb2 := a.ok("POST", item+"/heartbeat?desired_ttl_seconds=30&expected_last_heartbeat="+last, nil, key...)
	if hb2["last_heartbeat"] == last || hb2["ttl_seconds"] != 30.0 {
		t.Fatalf("second heartbeat %v", hb2)
	}
	last = hb2["last_heartbeat"].(string)

	// Get, list, update metadata.
	if g := a.ok("GET", item, nil); g["state"] != "active" || g["started_at"] == nil || g["latest_heartbeat_at"] == nil || g["secret"] != nil {
		t.Fatalf("get %v", g)
	}
	if l := a.ok("GET", work+"?limit=1", nil, key...); len(l["data"].([]any)) != 1 || l["next_page"] != nil {
		t.Fatalf("list %v", l)
	}
	a.fail(400, "GET", work+"?limit=0", nil)
	a.fail(400, "POST", item, map[string]any{}, key...)
	a.fail(400, "POST", item, map[string]any{"metadata": map[string]any{"a": 1}})
	a.fail(400, "POST", item, map[string]any{"metadata": map[string]any{}, "state": "stopped"})
	if u := a.ok("POST", item, map[string]any{"metadata": map[string]any{"a": "1", "b": "2"}}); u["metadata"].(map[string]any)["b"] != "2" {
		t.Fatalf("update %v", u)
	}
	if u := a.ok("POST", item, map[string]any{"metadata": map[string]any{"b": nil}}); len(u["metadata"].(map[string]any)) != 1 {
		t.Fatalf("update %v", u)
	}

	// A lease that ran out: the heartbeat is told (412, queued) and the
	// item goes back to the queue for the next poll.
	a.sql(`UPDATE environment_work SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	expired := a.do("POST", item+"/heartbeat?expected_last_heartbeat="+last, nil, key...)
	if expired.status != 412 || !strings.Contains(string(expired.body), `"state":"queued"`) {
		t.Fatalf("expired lease: %d %s", expired.status, expired.body)
	}
	if again := a.ok("GET", work+"/poll", nil, key...); again["id"] != id {
		t.Fatalf("after the lease: %v", again)
	}
	a.ok("POST", item+"/ack", nil, key...)
	last = a.ok("POST", item+"/heartbeat?expected_last_heartbeat=NO_HEARTBEAT", nil, key...)["last_heartbeat"].(string)

	// A graceful stop: the holder's heartbeat says stopping, unextended.
	a.fail(400, "POST", item+"/stop", `{"force":"yes"}`, key...)
	if s := a.ok("POST", item+"/stop", nil); s["state"] != "stopping" || s["stop_requested_at"] == nil {
		t.Fatalf("stop %v", s)
	}
	if hb := a.ok("POST", item+"/heartbeat?expected_last_heartbeat=whatever", nil, key...); hb["state"] != "stopping" || hb["lease_extended"] != false {
		t.Fatalf("heartbeat while stopping %v", hb)
	}
	if s := a.ok("POST", item+"/stop", map[string]any{"force": true}, key...); s["state"] != "stopped" || s["stopped_at"] == nil {
		t.Fatalf("force stop %v", s)
	}
	a.fail(409, "POST", item+"/stop", map[string]any{"force": true}, key...)
	_ = last

	// New input to the session, which no worker holds now: a new item.
	a.ok("POST", "/v1/sessions/"+sessionID+"/events", map[string]any{"events": []any{map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "hi"}}}}})
	next := a.ok("GET", work+"/poll", nil, key...)
	if next["id"] == id || next["data"].(map[string]any)["id"] != sessionID {
		t.Fatalf("after new input: %v", next)
	}
	// Its worker stops it while a call waits for its result: another item,
	// for another worker.
	a.ok("POST", work+"/"+next["id"].(string)+"/ack", nil, key...)
	a.sql(`UPDATE events SET processed_at = now() WHERE session_id = $1`, sessionID)
	appendToolUse(a, sessionID, "sevt_waits")
	a.ok("POST", work+"/"+next["id"].(string)+"/stop", map[string]any{"force": true}, key...)
	if third := a.ok("GET", work+"/poll", nil, key...); third["id"] == next["id"] || third["state"] != "queued" {
		t.Fatalf("after a stop with a call waiting: %v", third)
	}
}

// appendToolUse puts an agent.tool_use into the session's log, as the
// agent loop would.
func appendToolUse(a *testAPI, sessionID, id string) {
	a.t.Helper()
	a.sql(`WITH s AS (UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING tenant_id, id, last_seq)
		INSERT INTO events (tenant_id, session_id, seq, id, type, body, processed_at)
		SELECT tenant_id, id, last_seq, $2, 'agent.tool_use',
		       jsonb_build_object('id', $2::text, 'type', 'agent.tool_use', 'name', 'bash', 'input', '{}'::jsonb, 'evaluated_permission', 'allow'), now()
		FROM s`, sessionID, id)
}

func TestEnvironmentKeysAndToolResults(t *testing.T) {
	a := setupWithEvents(t)
	envID, sessionID, _, cloudSession := selfHostedFixtures(t, a)
	key := []string{"X-Test-Environment", envID}
	events := "/v1/sessions/" + sessionID + "/events"
	result := func(toolUseID, text string) map[string]any {
		return map[string]any{"events": []any{map[string]any{"type": "user.tool_result", "tool_use_id": toolUseID, "content": []any{map[string]any{"type": "text", "text": text}}}}}
	}

	// An environment key reaches its sessions' worker routes, nothing else.
	a.ok("GET", "/v1/sessions/"+sessionID, nil, key...)
	a.ok("GET", events, nil, key...)
	a.fail(404, "GET", "/v1/sessions/"+cloudSession, nil, key...)
	a.fail(404, "GET", "/v1/sessions/"+cloudSession+"/events", nil, key...)
	for _, route := range [][2]string{{"GET", "/v1/agents"}, {"GET", "/v1/sessions"}, {"POST", "/v1/environments"}, {"GET", "/v1/environments/" + envID}} {
		if r := a.do(route[0], route[1], map[string]any{}, key...); r.status != 403 {
			t.Errorf("%s %s as an environment key: %d %s", route[0], route[1], r.status, r.body)
		}
	}
	if r := a.do("POST", events, map[string]any{"events": []any{map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "hi"}}}}}, key...); r.status != 403 {
		t.Fatalf("user.message as an environment key: %d %s", r.status, r.body)
	}

	// user.tool_result: self-hosted sessions only, for a call that waits,
	// once.
	appendToolUse(a, sessionID, "sevt_use1")
	appendToolUse(a, cloudSession, "sevt_use2")
	if msg := a.fail(400, "POST", "/v1/sessions/"+cloudSession+"/events", result("sevt_use2", "x")); !strings.Contains(msg, "self_hosted") {
		t.Fatalf("cloud session: %q", msg)
	}
	a.fail(400, "POST", events, result("sevt_nope", "x"), key...)
	a.fail(400, "POST", events, map[string]any{"events": []any{map[string]any{"type": "user.tool_result", "tool_use_id": "sevt_use1", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": "https://x"}}}}}}, key...)
	a.fail(400, "POST", events, map[string]any{"events": []any{map[string]any{"type": "user.tool_result", "tool_use_id": "sevt_use1", "name": "bash"}}}, key...)
	a.fail(413, "POST", events, result("sevt_use1", strings.Repeat("x", maxToolResultBytes+1)), key...)
	a.ok("POST", events, result("sevt_use1", "hi"), key...)
	a.fail(409, "POST", events, result("sevt_use1", "again"))
	// Two results for one call in one request: the second is refused too.
	appendToolUse(a, sessionID, "sevt_use3")
	two := result("sevt_use3", "a")
	two["events"] = append(two["events"].([]any), result("sevt_use3", "b")["events"].([]any)...)
	a.fail(409, "POST", events, two, key...)

	// A call whose turn ended (an interrupt) takes no result.
	appendToolUse(a, sessionID, "sevt_use4")
	a.sql(`WITH s AS (UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING tenant_id, id, last_seq)
		INSERT INTO events (tenant_id, session_id, seq, id, type, body, processed_at)
		SELECT tenant_id, id, last_seq, 'sevt_idle', 'session.status_idle', '{"type":"session.status_idle","stop_reason":{"type":"end_turn"}}', now() FROM s`, sessionID)
	if msg := a.fail(409, "POST", events, result("sevt_use4", "late"), key...); !strings.Contains(msg, "ended") {
		t.Fatalf("late result: %q", msg)
	}

	// The environment's type is fixed.
	a.fail(400, "POST", "/v1/environments/"+envID, map[string]any{"config": map[string]any{"type": "cloud"}})
	a.fail(400, "POST", "/v1/environments", map[string]any{"name": "x", "config": map[string]any{"type": "self_hosted", "networking": map[string]any{"type": "limited"}}})
}

// A self-hosted session takes no resources: corral mounts them in its own
// sandboxes, and the session's tools run on the tenant's worker.
func TestSelfHostedSessionsTakeNoResources(t *testing.T) {
	a := setupWithEvents(t)
	envID, sessionID, _, _ := selfHostedFixtures(t, a)
	agentID := a.ok("GET", "/v1/agents", nil)["data"].([]any)[0].(map[string]any)["id"]
	up := a.upload("", csvPart("data.csv", "a\n"))
	if up.status != 200 {
		t.Fatalf("upload: %d %s", up.status, up.body)
	}
	res := map[string]any{"type": "file", "file_id": up.json(t)["id"]}
	for _, c := range []struct {
		path string
		body any
	}{
		{"/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID, "resources": []any{res}}},
		{"/v1/sessions/" + sessionID + "/resources", res},
	} {
		if msg := a.fail(400, "POST", c.path, c.body); !strings.Contains(msg, "a self_hosted environment's sessions run their tools on the tenant's worker") {
			t.Fatalf("POST %s: %s", c.path, msg)
		}
	}
}

// Nor does it take skills: their files are staged in corral's sandboxes,
// and nothing hands them to the worker. Through an agent's skills or an
// override, the create is a 400; the same agent without them starts.
func TestSelfHostedSessionsTakeNoSkills(t *testing.T) {
	a := setupWithEvents(t)
	envID, _, _, _ := selfHostedFixtures(t, a)
	up := a.uploadSkill("/v1/skills", "", skillPart("csv/SKILL.md", testSkillMD))
	if up.status != 200 {
		t.Fatalf("skill upload: %d %s", up.status, up.body)
	}
	skill := map[string]any{"type": "custom", "skill_id": up.json(t)["id"]}
	agent := a.ok("POST", "/v1/agents", map[string]any{"name": "skilled", "model": "claude-sonnet-4-5", "skills": []any{skill}})
	const want = "which corral does not hand skills to yet"
	if msg := a.fail(400, "POST", "/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": envID}); !strings.Contains(msg, want) {
		t.Fatalf("a self-hosted session of an agent with skills: %s", msg)
	}
	override := map[string]any{"type": "agent_with_overrides", "id": agent["id"], "skills": []any{}}
	if s := a.ok("POST", "/v1/sessions", map[string]any{"agent": override, "environment_id": envID}); s["id"] == nil {
		t.Fatalf("the same agent without its skills: %v", s)
	}
}
