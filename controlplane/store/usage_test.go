package store_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Tokens appended with a model request's events land in the session's
// row of the hour; an append refused (its event ids repeat) adds nothing;
// sandbox intervals open and close idempotently; each tenant reads only
// its own usage, operators every tenant's.
func TestUsageReport(t *testing.T) {
	s, ctx, other := setupResources(t)
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: json.RawMessage(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Sessions().Create(ctx, store.Session{AgentID: ag.ID, AgentVersion: 1, Agent: ag.Spec, EnvironmentID: env.ID})
	if err != nil {
		t.Fatal(err)
	}
	end := func(id string) store.Append {
		return store.Append{
			Events: []store.NewEvent{{ID: id, Type: "span.model_request_end", Body: []byte(`{"id":"` + id + `","type":"span.model_request_end"}`)}},
			Usage:  store.TokenUsage{InputTokens: 10, OutputTokens: 3, CacheReadInputTokens: 2, CacheCreationInputTokens: 1, Model: "claude-x"},
		}
	}
	for _, id := range []string{"sevt_1", "sevt_2"} {
		if _, err := s.Events().Append(ctx, sess.ID, end(id)); err != nil {
			t.Fatal(err)
		}
	}
	// A retry of a committed append fails on its event id, and its tokens
	// with it.
	if _, err := s.Events().Append(ctx, sess.ID, end("sevt_2")); err == nil {
		t.Fatal("an append repeating an event id was accepted")
	}

	t0 := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	if open, err := s.Usage().ClaimMeter(ctx, 1); err != nil || len(open) != 0 {
		t.Fatalf("claiming the meter: %v, %v", open, err)
	}
	set := func(state, host string, at time.Time) {
		t.Helper()
		if err := s.Usage().SetSandboxState(ctx, 1, sess.ID, state, host, at); err != nil {
			t.Fatal(err)
		}
	}
	set(store.SandboxRunning, "h1", t0.Add(30*time.Minute))
	set(store.SandboxRunning, "h1", t0.Add(40*time.Minute))  // a replay: nothing changes
	set(store.SandboxPaused, "h1", t0.Add(90*time.Minute))   // 60 min running, 30 of them in the first hour
	set(store.SandboxRunning, "h2", t0.Add(100*time.Minute)) // 10 min paused; runs on h2, open
	open, err := s.Usage().OpenSandboxIntervals(ctx)
	if err != nil || len(open) != 1 || open[0].State != store.SandboxRunning || open[0].HostID != "h2" || open[0].Tenant != tenant.Default {
		t.Fatalf("open intervals %+v, %v", open, err)
	}
	if err := s.Usage().SetSandboxState(ctx, 1, sess.ID, "sleeping", "h1", t0); err == nil {
		t.Error("an unknown state was accepted")
	}

	now := t0.Add(110 * time.Minute)
	q := store.UsageQuery{Start: t0, End: t0.Add(3 * time.Hour), Unit: store.UsageHour, Now: now, Limit: 100}
	rows, err := s.Usage().Report(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var running, paused float64
	var in, out, cr, cc int64
	for _, r := range rows {
		if r.Tenant != tenant.Default || r.SessionID != sess.ID {
			t.Errorf("row of another session: %+v", r)
		}
		running += r.RunningSeconds
		paused += r.PausedSeconds
		in, out, cr, cc = in+r.InputTokens, out+r.OutputTokens, cr+r.CacheReadInputTokens, cc+r.CacheCreationInputTokens
		if r.Model == "" && r.Bucket.Equal(t0) && r.RunningSeconds != 30*60 {
			t.Errorf("first hour ran %vs, want 1800", r.RunningSeconds)
		}
	}
	// 60 min on h1, then 10 min on h2 up to now.
	if running != 70*60 || paused != 10*60 {
		t.Errorf("running %vs paused %vs, want 4200 and 600", running, paused)
	}
	if in != 20 || out != 6 || cr != 4 || cc != 2 {
		t.Errorf("tokens %d/%d/%d/%d, want 20/6/4/2", in, out, cr, cc)
	}

	// By day: one token row and one sandbox row (or two, across midnight).
	day, err := s.Usage().Report(ctx, store.UsageQuery{Start: t0, End: t0.Add(3 * time.Hour), Unit: store.UsageDay, Now: now, Limit: 100})
	if err != nil || len(day) < 2 || len(day) > 4 {
		t.Fatalf("by day: %+v, %v", day, err)
	}
	// Paging: one row at a time reads them all.
	var paged int
	for off := 0; off < 20; off++ {
		p := q
		p.Offset, p.Limit = off, 1
		got, err := s.Usage().Report(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		paged++
	}
	if paged != len(rows) {
		t.Errorf("paged %d rows, want %d", paged, len(rows))
	}

	// Another tenant sees none of it; operators see it by tenant or all.
	if got, err := s.Usage().Report(other, q); err != nil || len(got) != 0 {
		t.Errorf("tenant_b reads %+v, %v", got, err)
	}
	if err := s.Usage().SetSandboxState(other, 1, sess.ID, "", "h2", now); err != nil {
		t.Fatal(err)
	}
	if open, _ := s.Usage().OpenSandboxIntervals(ctx); len(open) != 1 {
		t.Errorf("tenant_b closed the default tenant's interval: %+v", open)
	}
	all, err := s.Usage().ReportAll(ctx, "", q)
	if err != nil || len(all) != len(rows) {
		t.Errorf("operators read %d rows, %v; want %d", len(all), err, len(rows))
	}
	if got, err := s.Usage().ReportAll(ctx, "tenant_b", q); err != nil || len(got) != 0 {
		t.Errorf("operators read tenant_b's %+v, %v", got, err)
	}

	// A tenant that is gone: a precondition the meter stops retrying.
	if err := s.Usage().SetSandboxState(tenant.With(ctx, "tenant_gone"), 1, "sesn_x", store.SandboxRunning, "h1", now); errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
		t.Errorf("an interval of a tenant that does not exist: %v", err)
	}
	// A later term's claim fences the earlier one out: its writes and
	// its claim are refused; the new one reads the open interval.
	open, err = s.Usage().ClaimMeter(ctx, 2)
	if err != nil || len(open) != 1 {
		t.Fatalf("claiming term 2: %+v, %v", open, err)
	}
	if err := s.Usage().SetSandboxState(ctx, 1, sess.ID, "", "", now); !errors.Is(err, store.ErrStaleMeter) || errdefs.KindOf(err) != errdefs.ConflictKind {
		t.Fatalf("term 1 writing after term 2's claim: %v", err)
	}
	if _, err := s.Usage().ClaimMeter(ctx, 1); !errors.Is(err, store.ErrStaleMeter) {
		t.Fatalf("term 1 claiming again: %v", err)
	}
	// Release closes the interval; later reads end it there.
	if err := s.Usage().SetSandboxState(ctx, 2, sess.ID, "", "", now); err != nil {
		t.Fatal(err)
	}
	if open, _ := s.Usage().OpenSandboxIntervals(ctx); len(open) != 0 {
		t.Errorf("open after release: %+v", open)
	}
	q.Now = now.Add(time.Hour)
	rows, _ = s.Usage().Report(ctx, q)
	running = 0
	for _, r := range rows {
		running += r.RunningSeconds
	}
	if running != 70*60 {
		t.Errorf("after release, running %vs, want 4200", running)
	}
}
