package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// pricedPolicy is the shipped policy with prices for claude-test: $0.10 a
// token, so that one reply of the test API (10 tokens in, 5 out) lists at
// $1.50.
func pricedPolicy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"roles.yaml", "quotas.yaml", "runtimes.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "policy", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	prices := "model_prices:\n  claude-test: {input: 100000, output: 100000, cache_write: 100000, cache_read: 100000}\n"
	if err := os.WriteFile(filepath.Join(dir, "prices.yaml"), []byte(prices), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A session's budget (the v2 SDK's budget.max_list_cost): a turn that
// finds it spent ends with stop_reason budget_reached before its model
// request; raising it above what was spent lets the next turn run; a
// model without a list price cannot have one.
func TestSessionBudget(t *testing.T) {
	api := newMessagesAPI(t)
	srv := servertest.Start(t, pgtest.New(t), server.Config{
		NodeID: "node-a", Model: "anthropic", AnthropicBaseURL: api.URL, AnthropicAPIKey: "sk-ant-e2e", PolicyDir: pricedPolicy(t),
	})
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	agent := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "b", "model": "claude-test"})
	unpriced := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "u", "model": "claude-unpriced"})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "e"})
	budget := func(cents string) map[string]any {
		return map[string]any{"type": "limit", "max_list_cost": map[string]any{"amount": cents, "currency": "USD"}}
	}
	if code, _, body := postStatus(t, c, base+"/v1/sessions", map[string]any{"agent": unpriced["id"], "environment_id": env["id"], "budget": budget("100")}); code != http.StatusBadRequest || !strings.Contains(body, "model_not_budgetable") {
		t.Errorf("a budget on an unpriced model: %d %s", code, body)
	}
	for _, bad := range []map[string]any{budget("0"), budget("0100"), budget("1.5"), {"type": "limit", "max_list_cost": map[string]any{"amount": "100", "currency": "EUR"}}} {
		if code, _, body := postStatus(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"], "budget": bad}); code != http.StatusBadRequest {
			t.Errorf("budget %v: %d %s, want 400", bad, code, body)
		}
	}
	sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"], "budget": budget("100")})
	sid := sess["id"].(string)
	if got := sess["budget"].(map[string]any)["max_list_cost"].(map[string]any); got["amount"] != "100" || got["currency"] != "USD" {
		t.Errorf("session budget = %v", sess["budget"])
	}

	idle := func(frames []sseFrame) string {
		last := frames[len(frames)-1].data
		return last["stop_reason"].(map[string]any)["type"].(string)
	}
	if frames := turn(t, c, base, sid, "one"); idle(frames) != "end_turn" {
		t.Fatalf("the first turn (within the budget): %s", frameKinds(frames))
	}
	frames := turn(t, c, base, sid, "two")
	if idle(frames) != "budget_reached" || strings.Contains(frameKinds(frames), "span.model_request_start") {
		t.Errorf("the second turn ($1.50 spent of $1.00): %s, stop %s", frameKinds(frames), idle(frames))
	}
	if n := len(api.requests()); n != 1 {
		t.Errorf("%d model requests, want 1", n)
	}
	got, err := c.Get(base + "/v1/sessions/" + sid)
	if err != nil {
		t.Fatal(err)
	}
	var view struct {
		Usage struct {
			ListCost map[string]string `json:"list_cost"`
		} `json:"usage"`
	}
	err = json.NewDecoder(got.Body).Decode(&view)
	got.Body.Close()
	if err != nil || view.Usage.ListCost["amount"] != "150" || view.Usage.ListCost["currency"] != "USD" {
		t.Errorf("usage.list_cost = %v (%v), want 150 cents", view.Usage.ListCost, err)
	}

	if code, _, body := postStatus(t, c, base+"/v1/sessions/"+sid, map[string]any{"budget": budget("120")}); code != http.StatusBadRequest || !strings.Contains(body, "budget_not_raised") {
		t.Errorf("lowering the budget below what was spent: %d %s", code, body)
	}
	postJSON(t, c, base+"/v1/sessions/"+sid, map[string]any{"budget": budget("1000")})
	if frames := turn(t, c, base, sid, "three"); idle(frames) != "end_turn" {
		t.Errorf("after raising the budget: %s", frameKinds(frames))
	}
	// A session made without a budget never gets one: the node skips the
	// read of its budget before each model request once it saw none
	// (sessionFacts), which this refusal keeps true.
	plain := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})
	if frames := turn(t, c, base, plain["id"].(string), "four"); idle(frames) != "end_turn" {
		t.Errorf("a session without a budget: %s", frameKinds(frames))
	}
	if code, _, body := postStatus(t, c, base+"/v1/sessions/"+plain["id"].(string), map[string]any{"budget": budget("100")}); code != http.StatusBadRequest || !strings.Contains(body, "budget_create_only") {
		t.Errorf("adding a budget later: %d %s", code, body)
	}
	if frames := turn(t, c, base, plain["id"].(string), "five"); idle(frames) != "end_turn" {
		t.Errorf("a session without a budget, after the refused one: %s", frameKinds(frames))
	}
}
