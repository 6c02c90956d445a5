package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/policy"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// sendAs does one request with an API key and returns status and body.
func sendAs(t *testing.T, key, method, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// The fleet verbs over REST through the gateway: a node started by
// servertest bootstraps a one-node Raft cluster, so they work at once.
func TestFleetOverREST(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	op := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr() + "/admin/v1"

	code, body := sendAs(t, op, "POST", base+"/hosts", `{"id":"h1","runtimes":["runsc"],"capacity":{"cpu_millis":4000,"memory_mib":8192}}`)
	if code != 200 {
		t.Fatalf("register host: %d %s", code, body)
	}
	place := `{"tenant":"t1","session_id":"s1","resources":{"cpu_millis":500,"memory_mib":512}}`
	code, first := sendAs(t, op, "POST", base+"/sandboxes", place)
	code2, again := sendAs(t, op, "POST", base+"/sandboxes", place)
	if code != 200 || code2 != 200 || !bytes.Equal(first, again) {
		t.Fatalf("placing twice: %d %s, then %d %s", code, first, code2, again)
	}
	if code, body := sendAs(t, op, "POST", base+"/hosts/h1:cordon", ""); code != 200 || !bytes.Contains(body, []byte(`"eligible":false`)) {
		t.Fatalf("cordon: %d %s", code, body)
	}
	if code, body := sendAs(t, op, "POST", base+"/hosts/ghost:cordon", ""); code != 404 {
		t.Fatalf("cordon an unknown host: %d %s", code, body)
	}
	if code, body := sendAs(t, op, "POST", base+"/hosts/ghost:drain", ""); code != 404 {
		t.Fatalf("drain an unknown host: %d %s, want 404", code, body)
	}
	code, body = sendAs(t, op, "GET", base+"/hosts", "")
	var hosts struct {
		Hosts []struct {
			ID        string `json:"id"`
			Eligible  bool   `json:"eligible"`
			Sandboxes int    `json:"sandboxes"`
		} `json:"hosts"`
	}
	if err := json.Unmarshal(body, &hosts); code != 200 || err != nil || len(hosts.Hosts) != 1 || hosts.Hosts[0].Eligible || hosts.Hosts[0].Sandboxes != 1 {
		t.Fatalf("hosts: %d %s %v", code, body, err)
	}
	if code, body := sendAs(t, op, "DELETE", base+"/cluster/members/node-a", ""); code != 409 || !bytes.Contains(body, []byte("last voter")) {
		t.Fatalf("removing the last voter: %d %s, want a refusal", code, body)
	}
	// h1 has no agent behind it: its sandbox cannot move, and is evicted
	// at the drain's deadline.
	if code, body := sendAs(t, op, "POST", base+"/hosts/h1:drain?deadline=1s", ""); code != 200 || !bytes.Contains(body, []byte("evicted")) {
		t.Fatalf("drain: %d %s", code, body)
	}
	if code, body := sendAs(t, op, "DELETE", base+"/sandboxes/s1", ""); code != 404 {
		t.Fatalf("release after the drain evicted it: %d %s, want 404", code, body)
	}
	var tok struct{ Token string }
	code, body = sendAs(t, op, "POST", base+"/hosts:issueJoinToken", `{"ttl":"60s"}`)
	if err := json.Unmarshal(body, &tok); code != 200 || err != nil || len(strings.Split(tok.Token, ".")) != 3 {
		t.Fatalf("join token: %d %s %v", code, body, err)
	}
	if code, body := sendAs(t, servertest.TenantKey(t, srv, tenant.Default), "POST", base+"/hosts:issueJoinToken", `{}`); code != 403 {
		t.Fatalf("join token with a tenant key: %d %s, want 403", code, body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := grpcClient(t, srv.GRPCAddr(), op).GetStatus(ctx, &adminv1.GetStatusRequest{})
	if err != nil || st.GetRaftState() != "Leader" || st.GetLeaderId() != "node-a" || st.GetAppliedIndex() == 0 || len(st.GetMembers()) != 1 {
		t.Fatalf("status: %v %v", st, err)
	}
}

// A tenant without a quota of its own is bound by the policy's default
// (concurrent_sandboxes: 20) at placement, as the README says; before, the
// default reached Raft only through a SetQuota, so such tenants were
// unbounded.
func TestDefaultSandboxQuotaBindsTenantsWithoutOverrides(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	op := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr() + "/admin/v1"
	if code, body := sendAs(t, op, "POST", base+"/hosts", `{"id":"h1","runtimes":["runsc"],"capacity":{"cpu_millis":400000,"memory_mib":819200,"disk_mib":819200}}`); code != 200 {
		t.Fatalf("register host: %d %s", code, body)
	}
	pol, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	limit := pol.DefaultQuota.ConcurrentSandboxes
	place := func(tenantID string, i int) (int, []byte) {
		return sendAs(t, op, "POST", base+"/sandboxes", fmt.Sprintf(`{"tenant":%q,"session_id":"%s-%d","resources":{"cpu_millis":10,"memory_mib":16}}`, tenantID, tenantID, i))
	}
	for i := range limit {
		if code, body := place("tenant_a", i); code != 200 {
			t.Fatalf("placement %d of %d: %d %s", i+1, limit, code, body)
		}
	}
	code, body := place("tenant_a", limit)
	if code != 429 || !bytes.Contains(body, []byte("concurrent_sandboxes")) {
		t.Fatalf("placement %d, over the default quota of %d: %d %s", limit+1, limit, code, body)
	}
	// Another tenant is bound by its own count, not tenant_a's.
	if code, body := place("tenant_b", 0); code != 200 {
		t.Fatalf("another tenant's first placement: %d %s", code, body)
	}
}
