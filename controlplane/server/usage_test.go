package server_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/metrics/metricstest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// A session runs a tool call in a gVisor sandbox, goes idle and has its
// sandbox paused: the usage export (JSON and CSV, over the REST gateway)
// has the session's tokens of the fake model and nonzero running and
// paused seconds; the usage counters moved; another tenant's admin sees
// none of it and is refused the first tenant's; an operator sees it.
func TestUsageAfterASessionWithAPause(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor,
		PauseAfterIdle: 300 * time.Millisecond, MetricsAddr: "127.0.0.1:0"})
	startGVisorHostWith(t, srv, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir(), Pausable: true})
	s := newToolSession(t, srv)
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo metered"}`)); !strings.Contains(out, "metered") {
		t.Fatalf("tool result %q", out)
	}
	waitPlacement(t, srv, s.id, time.Minute, "the idle session's sandbox to be paused", func(p scheduler.Placement, _ raftfsm.View) bool {
		return p.Paused()
	})
	// The leader's meter writes the pause on the FSM's signal.
	waitfor.State(t, 30*time.Second, "the pause in the usage record", func() (bool, string) {
		open, err := srv.Store().Usage().OpenSandboxIntervals(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return len(open) == 1 && open[0].SessionID == s.id && open[0].State == store.SandboxPaused, fmt.Sprint(open)
	})

	base := "http://" + srv.HTTPAddr() + "/admin/v1"
	keyA := servertest.TenantKey(t, srv, tenant.Default)
	fetch := func(key, path, accept string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("x-api-key", key)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	export := func(key, path string) *adminv1.ExportUsageResponse {
		t.Helper()
		code, _, body := fetch(key, path, "")
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		var r adminv1.ExportUsageResponse
		if err := protojson.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
		return &r
	}
	type totals struct {
		in, out             int64
		running, paused     float64
		otherSessions, rows int
	}
	sum := func(rows []*adminv1.UsageRow) (tt totals) {
		for _, r := range rows {
			tt.rows++
			if r.GetSessionId() != s.id || r.GetTenantId() != string(tenant.Default) {
				tt.otherSessions++
				continue
			}
			if r.GetModel() != "" && r.GetModel() != "fake" {
				t.Errorf("tokens of model %q", r.GetModel())
			}
			tt.in += r.GetInputTokens()
			tt.out += r.GetOutputTokens()
			tt.running += r.GetRunningSeconds()
			tt.paused += r.GetPausedSeconds()
		}
		return tt
	}

	got := sum(export(keyA, "/usage:export?granularity=hour").GetRows())
	if got.in <= 0 || got.out <= 0 || got.running <= 0 || got.paused <= 0 || got.otherSessions != 0 {
		t.Errorf("tenant A's export: %+v; want its session's tokens and running and paused seconds", got)
	}
	t.Logf("tenant A's export by hour: %+v", got)

	// CSV, asked for either way.
	for _, c := range []struct{ path, accept string }{
		{"/usage:export?format=csv", ""},
		{"/usage:export", "text/csv"},
	} {
		code, ctype, body := fetch(keyA, c.path, c.accept)
		if code != http.StatusOK || !strings.HasPrefix(ctype, "text/csv") {
			t.Fatalf("CSV export %s (Accept %q): %d %s %s", c.path, c.accept, code, ctype, body)
		}
		recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
		if err != nil || len(recs) < 3 || strings.Join(recs[0], ",") != "bucket_start,tenant_id,session_id,model,input_tokens,output_tokens,cache_read_input_tokens,cache_creation_input_tokens,running_seconds,paused_seconds" {
			t.Fatalf("CSV export: %v\n%s", err, body)
		}
		var tokens int64
		var running float64
		for _, r := range recs[1:] {
			if r[2] != s.id {
				t.Errorf("CSV row of another session: %v", r)
			}
			n, _ := strconv.ParseInt(r[4], 10, 64)
			f, _ := strconv.ParseFloat(r[8], 64)
			tokens, running = tokens+n, running+f
		}
		if tokens != got.in || running <= 0 {
			t.Errorf("CSV export: %d input tokens (JSON %d), %v running seconds", tokens, got.in, running)
		}
	}

	// Tenant B's admin sees none of it, and may not ask for A's.
	keyB := servertest.TenantKey(t, srv, "tenant_b")
	if b := sum(export(keyB, "/usage:export").GetRows()); b.rows != 0 {
		t.Errorf("tenant B's export has %d rows", b.rows)
	}
	// (Another tenant's id is not found to a tenant's principal, as
	// everywhere in the admin API.)
	if code, _, body := fetch(keyB, "/tenants/"+string(tenant.Default)+"/usage", ""); code != http.StatusNotFound {
		t.Errorf("tenant B asking for A's usage: %d %s", code, body)
	}
	// A developer is not an admin: usage:read is not theirs.
	if code, _, _ := fetch(servertest.TenantKey(t, srv, tenant.Default, "developer"), "/usage", ""); code != http.StatusForbidden {
		t.Errorf("a developer reading usage: %d", code)
	}
	// An operator sees every tenant's, or one's, a page at a time.
	op := servertest.OperatorKey(t, db)
	if o := sum(export(op, "/tenants/"+string(tenant.Default)+"/usage:export").GetRows()); o.in != got.in || o.rows == 0 {
		t.Errorf("the operator's export of tenant A: %+v", o)
	}
	code, _, body := fetch(op, "/usage?page_size=1&granularity=hour", "")
	var page adminv1.GetUsageResponse
	if err := protojson.Unmarshal([]byte(body), &page); code != http.StatusOK || err != nil || len(page.GetRows()) != 1 || page.GetNextPageToken() == "" {
		t.Fatalf("first page: %d %v %s", code, err, body)
	}
	if code, _, body := fetch(op, "/usage?granularity=minute", ""); code != http.StatusBadRequest {
		t.Errorf("granularity minute: %d %s", code, body)
	}

	m := metricstest.Get(t, srv.MetricsURL())
	for _, c := range []map[string]string{
		{"tenant": string(tenant.Default), "model": "fake", "kind": "input"},
		{"tenant": string(tenant.Default), "model": "fake", "kind": "output"},
	} {
		if v, _ := m.Value("corral_usage_model_tokens_total", c); v < 1 {
			t.Errorf("corral_usage_model_tokens_total%v = %v", c, v)
		}
	}
	for _, state := range []string{"running", "paused"} {
		if v, _ := m.Value("corral_usage_sandbox_seconds_total", map[string]string{"tenant": string(tenant.Default), "state": state}); v <= 0 {
			t.Errorf("corral_usage_sandbox_seconds_total{%s} = %v, want more than 0", state, v)
		}
	}
}
