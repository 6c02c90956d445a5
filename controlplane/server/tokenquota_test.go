package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// A tenant's model_tokens_per_day, set through the admin API: the turn
// that spends it runs, the next user.message is refused with a 429 that
// names the quota; another tenant is not affected.
func TestModelTokenQuota(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a"}) // the fake model: 3 tokens in, 2 out per call
	base := "http://" + srv.HTTPAddr()
	a := withKey(servertest.TenantKey(t, srv, "tenant_a"))
	b := withKey(servertest.TenantKey(t, srv, "tenant_b"))
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	limit := int64(1)
	q, err := admin.SetQuota(context.Background(), &adminv1.SetQuotaRequest{TenantId: "tenant_a", Overrides: &adminv1.QuotaOverride{ModelTokensPerDay: &limit}})
	if err != nil || q.Effective.ModelTokensPerDay != 1 || q.Overrides.GetModelTokensPerDay() != 1 {
		t.Fatalf("SetQuota = %+v, %v", q, err)
	}
	session := func(c *http.Client) string {
		agent := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "q", "model": "fake"})
		env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "q"})
		return postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})["id"].(string)
	}
	sa, sb := session(a), session(b)
	if frames := turn(t, a, base, sa, "hello"); !strings.Contains(frameKinds(frames), "agent.message") {
		t.Fatalf("the first turn: %s", frameKinds(frames))
	}
	msg := map[string]any{"events": []any{map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "more"}}}}}
	code, _, body := postStatus(t, a, base+"/v1/sessions/"+sa+"/events", msg)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "model_tokens_per_day") {
		t.Errorf("a message past the quota: %d %s, want 429 naming model_tokens_per_day", code, body)
	}
	if frames := turn(t, b, base, sb, "hello"); !strings.Contains(frameKinds(frames), "agent.message") {
		t.Errorf("the other tenant's turn: %s", frameKinds(frames))
	}
}

// A turn that spends the tenant's tokens mid-turn ends before its next
// model request (here the continuation of a paused response) with a
// session.error that names the quota.
func TestModelTokenQuotaEndsTheTurn(t *testing.T) {
	db := pgtest.New(t)
	api := newMessagesAPI(t, webTurn)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", Model: "anthropic", AnthropicBaseURL: api.URL, AnthropicAPIKey: "sk-ant-e2e"})
	base := "http://" + srv.HTTPAddr()
	a := withKey(servertest.TenantKey(t, srv, "tenant_a"))
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	limit := int64(20) // the paused reply uses 10 in and 20 out
	if _, err := admin.SetQuota(context.Background(), &adminv1.SetQuotaRequest{TenantId: "tenant_a", Overrides: &adminv1.QuotaOverride{ModelTokensPerDay: &limit}}); err != nil {
		t.Fatal(err)
	}
	agent := postJSON(t, a, base+"/v1/agents", webAgentBody())
	env := postJSON(t, a, base+"/v1/environments", map[string]any{"name": "q"})
	sid := postJSON(t, a, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})["id"].(string)
	frames := turn(t, a, base, sid, "search")
	var msg string
	for _, f := range frames {
		if f.event == "session.error" {
			e, _ := f.data["error"].(map[string]any)
			msg, _ = e["message"].(string)
			if e["type"] != "model_rate_limited_error" {
				t.Errorf("session.error = %v", e)
			}
		}
	}
	if !strings.Contains(msg, "model_tokens_per_day") {
		t.Errorf("no session.error naming the quota in %s", frameKinds(frames))
	}
	if n := len(api.requests()); n != 1 {
		t.Errorf("%d model requests, want 1 (the continuation is not made)", n)
	}
}
