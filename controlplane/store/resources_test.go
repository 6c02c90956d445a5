package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// setupResources returns a store on a fresh database, a context for the
// default tenant and one for a second tenant.
func setupResources(t *testing.T) (s *store.Store, a, b context.Context) {
	t.Helper()
	s, _, a, b = setupResourcesDB(t)
	return s, a, b
}

func setupResourcesDB(t *testing.T) (s *store.Store, db *pgtest.DB, a, b context.Context) {
	t.Helper()
	db = pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s = open(t, db.AppURL)
	return s, db, tenant.With(context.Background(), tenant.Default), tenant.With(context.Background(), "tenant_b")
}

func spec(s string) json.RawMessage { return json.RawMessage(`{"system":"` + s + `"}`) }

func TestAgentVersions(t *testing.T) {
	s, ctx, other := setupResources(t)
	ag, err := s.Agents().Create(ctx, "helper", spec("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ag.ID, store.AgentIDPrefix) || ag.Version != 1 || ag.LatestVersion != 1 {
		t.Fatalf("created %+v", ag)
	}
	// An update that changes nothing makes no version.
	same, err := s.Agents().Update(ctx, ag.ID, func(cur store.Agent) (string, json.RawMessage, error) {
		return cur.Name, cur.Spec, nil
	})
	if err != nil || same.Version != 1 {
		t.Fatalf("no-op update: %+v, %v", same, err)
	}
	v2, err := s.Agents().Update(ctx, ag.ID, func(cur store.Agent) (string, json.RawMessage, error) {
		return "helper 2", spec("v2"), nil
	})
	if err != nil || v2.Version != 2 || v2.Name != "helper 2" {
		t.Fatalf("update: %+v, %v", v2, err)
	}
	// apply's error aborts the update (the API's version check).
	_, err = s.Agents().Update(ctx, ag.ID, func(cur store.Agent) (string, json.RawMessage, error) {
		return "", nil, errdefs.Conflict("stale")
	})
	if !errdefs.IsConflict(err) {
		t.Fatalf("apply error: %v", err)
	}
	old, err := s.Agents().Get(ctx, ag.ID, 1)
	if err != nil || old.Name != "helper" || string(old.Spec) != `{"system": "v1"}` || old.LatestVersion != 2 {
		t.Fatalf("get v1: %+v (%s), %v", old, old.Spec, err)
	}
	if _, err := s.Agents().Get(ctx, ag.ID, 3); !errdefs.IsNotFound(err) {
		t.Fatalf("get v3: %v", err)
	}
	vs, more, err := s.Agents().ListVersions(ctx, ag.ID, 1, 0)
	if err != nil || !more || len(vs) != 1 || vs[0].Version != 2 {
		t.Fatalf("versions page 1: %+v, %v, %v", vs, more, err)
	}
	vs, more, err = s.Agents().ListVersions(ctx, ag.ID, 1, vs[0].Version)
	if err != nil || more || len(vs) != 1 || vs[0].Version != 1 {
		t.Fatalf("versions page 2: %+v, %v, %v", vs, more, err)
	}
	// Another tenant sees nothing.
	if _, err := s.Agents().Get(other, ag.ID, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant get: %v", err)
	}
	if _, _, err := s.Agents().ListVersions(other, ag.ID, 10, 0); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant versions: %v", err)
	}
	if _, err := s.Agents().Update(other, ag.ID, func(cur store.Agent) (string, json.RawMessage, error) { return "x", spec("x"), nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant update: %v", err)
	}
	// Archive is terminal and hides the agent from default listings.
	arch, err := s.Agents().Archive(ctx, ag.ID)
	if err != nil || arch.ArchivedAt == nil {
		t.Fatalf("archive: %+v, %v", arch, err)
	}
	if _, err := s.Agents().Update(ctx, ag.ID, func(cur store.Agent) (string, json.RawMessage, error) { return "x", spec("x"), nil }); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("update archived: %v", err)
	}
	list, _, err := s.Agents().List(ctx, store.AgentListOptions{})
	if err != nil || len(list) != 0 {
		t.Fatalf("list without archived: %+v, %v", list, err)
	}
	list, _, err = s.Agents().List(ctx, store.AgentListOptions{IncludeArchived: true})
	if err != nil || len(list) != 1 || list[0].Version != 2 {
		t.Fatalf("list with archived: %+v, %v", list, err)
	}
}

func TestAgentListPaging(t *testing.T) {
	s, ctx, other := setupResources(t)
	var ids []string
	for i := range 5 {
		a, err := s.Agents().Create(ctx, "a", spec(string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.ID)
	}
	if _, err := s.Agents().Create(other, "b", spec("b")); err != nil {
		t.Fatal(err)
	}
	var seen []string
	var after *store.Key
	for {
		page, more, err := s.Agents().List(ctx, store.AgentListOptions{Limit: 2, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page {
			seen = append(seen, a.ID)
		}
		if !more {
			break
		}
		last := page[len(page)-1]
		after = &store.Key{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	slices.Sort(seen)
	slices.Sort(ids)
	if !slices.Equal(seen, ids) {
		t.Fatalf("paged through %v, want each of %v once", seen, ids)
	}
	future := time.Now().Add(time.Hour)
	page, _, err := s.Agents().List(ctx, store.AgentListOptions{CreatedGte: &future})
	if err != nil || len(page) != 0 {
		t.Fatalf("created_at[gte] in the future: %d, %v", len(page), err)
	}
}

func TestEnvironments(t *testing.T) {
	s, ctx, other := setupResources(t)
	cfg := json.RawMessage(`{"type":"self_hosted"}`)
	e, err := s.Environments().Create(ctx, store.Environment{Name: "prod", Config: cfg, Scope: "organization", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(e.ID, store.EnvironmentIDPrefix) || e.Metadata["k"] != "v" || e.Description != nil {
		t.Fatalf("created %+v", e)
	}
	_, err = s.Environments().Create(ctx, store.Environment{Name: "prod", Config: cfg, Scope: "organization"})
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), `"prod"`) {
		t.Fatalf("duplicate name: %v", err)
	}
	// Names are unique per tenant, not globally.
	if _, err := s.Environments().Create(other, store.Environment{Name: "prod", Config: cfg, Scope: "organization"}); err != nil {
		t.Fatalf("same name in another tenant: %v", err)
	}
	e2, err := s.Environments().Create(ctx, store.Environment{Name: "staging", Config: cfg, Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Environments().Update(ctx, e2.ID, func(cur store.Environment) (store.Environment, error) {
		cur.Name = "prod"
		return cur, nil
	})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("rename onto a taken name: %v", err)
	}
	desc := "d"
	up, err := s.Environments().Update(ctx, e2.ID, func(cur store.Environment) (store.Environment, error) {
		cur.Description = &desc
		return cur, nil
	})
	if err != nil || up.Description == nil || *up.Description != "d" {
		t.Fatalf("update: %+v, %v", up, err)
	}
	if _, err := s.Environments().Get(other, e.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant get: %v", err)
	}
	if err := s.Environments().Delete(other, e.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant delete: %v", err)
	}
	list, _, err := s.Environments().List(ctx, store.EnvironmentListOptions{})
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	if _, err := s.Environments().Archive(ctx, e2.ID); err != nil {
		t.Fatal(err)
	}
	list, _, _ = s.Environments().List(ctx, store.EnvironmentListOptions{})
	if len(list) != 1 {
		t.Fatalf("list after archive: %d", len(list))
	}
	// In use by a session: cannot delete.
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Sessions().Create(ctx, store.Session{AgentID: ag.ID, AgentVersion: 1, Agent: ag.Spec, EnvironmentID: e.ID})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Environments().Delete(ctx, e.ID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete in use: %v", err)
	}
	if err := s.Sessions().Delete(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Environments().Delete(ctx, e.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := s.Environments().Get(ctx, e.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
}

func TestSessions(t *testing.T) {
	s, db, ctx, other := setupResourcesDB(t)
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: json.RawMessage(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	// Referring to another tenant's environment fails.
	if _, err := s.Sessions().Create(other, store.Session{AgentID: ag.ID, AgentVersion: 1, EnvironmentID: env.ID}); err == nil {
		t.Fatal("session in tenant b referring to tenant a's agent and environment was created")
	}
	var ids []string
	for range 5 {
		ss, err := s.Sessions().Create(ctx, store.Session{AgentID: ag.ID, AgentVersion: 1, Agent: ag.Spec, EnvironmentID: env.ID})
		if err != nil {
			t.Fatal(err)
		}
		if ss.Status != store.SessionIdle || !strings.HasPrefix(ss.ID, store.SessionIDPrefix) || len(ss.VaultIDs) != 0 {
			t.Fatalf("created %+v", ss)
		}
		ids = append(ids, ss.ID)
	}
	// Walk forward newest first, then back.
	var fwd []store.Session
	var key *store.Key
	for {
		page, more, err := s.Sessions().List(ctx, store.SessionListOptions{Limit: 2, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		fwd = append(fwd, page...)
		if !more {
			break
		}
		last := page[len(page)-1]
		key = &store.Key{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	if len(fwd) != 5 {
		t.Fatalf("forward walk saw %d sessions", len(fwd))
	}
	for i := 1; i < len(fwd); i++ {
		if fwd[i].CreatedAt.After(fwd[i-1].CreatedAt) {
			t.Fatalf("not newest first at %d", i)
		}
	}
	last := fwd[len(fwd)-1]
	back, more, err := s.Sessions().List(ctx, store.SessionListOptions{Limit: 10, Ascending: true, Key: &store.Key{CreatedAt: last.CreatedAt, ID: last.ID}})
	if err != nil || more || len(back) != 4 || back[0].ID != fwd[3].ID {
		t.Fatalf("backward from the oldest: %d, %v, %v", len(back), more, err)
	}
	agentID := ag.ID
	v := int64(2)
	page, _, err := s.Sessions().List(ctx, store.SessionListOptions{AgentID: &agentID, AgentVersion: &v})
	if err != nil || len(page) != 0 {
		t.Fatalf("agent_version filter: %d, %v", len(page), err)
	}
	page, _, err = s.Sessions().List(ctx, store.SessionListOptions{Statuses: []string{"running"}})
	if err != nil || len(page) != 0 {
		t.Fatalf("status filter: %d, %v", len(page), err)
	}
	page, _, err = s.Sessions().List(other, store.SessionListOptions{})
	if err != nil || len(page) != 0 {
		t.Fatalf("other tenant list: %d, %v", len(page), err)
	}

	title := "t"
	up, err := s.Sessions().Update(ctx, ids[0], func(cur store.Session) (store.Session, []store.NewEvent, error) {
		cur.Title = &title
		cur.Metadata = map[string]string{"a": "b"}
		return cur, []store.NewEvent{{ID: "sevt_1", Type: "session.updated", Body: []byte(`{"id":"sevt_1","type":"session.updated","title":"t"}`)}}, nil
	})
	if err != nil || *up.Title != "t" || up.Metadata["a"] != "b" {
		t.Fatalf("update: %+v, %v", up, err)
	}
	evs, err := s.Events().List(ctx, ids[0], store.EventQuery{})
	if err != nil || len(evs) != 1 || evs[0].Type != "session.updated" || evs[0].Seq != 1 {
		t.Fatalf("events after update: %+v, %v", evs, err)
	}
	// A running session can be neither archived nor deleted.
	exec(t, db.SuperuserURL, `UPDATE sessions SET status = 'running' WHERE id = $1`, ids[1])
	if _, err := s.Sessions().Archive(ctx, ids[1]); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("archive running: %v", err)
	}
	if err := s.Sessions().Delete(ctx, ids[1]); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("delete running: %v", err)
	}
	arch, err := s.Sessions().Archive(ctx, ids[0])
	if err != nil || arch.ArchivedAt == nil {
		t.Fatalf("archive: %+v, %v", arch, err)
	}
	if _, err := s.Sessions().Update(ctx, ids[0], func(cur store.Session) (store.Session, []store.NewEvent, error) { return cur, nil, nil }); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("update archived: %v", err)
	}
	if err := s.Sessions().Delete(other, ids[0]); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant delete: %v", err)
	}
	if err := s.Sessions().Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sessions().Get(ctx, ids[0]); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
}

func TestSessionCreateFrom(t *testing.T) {
	s, ctx, other := setupResources(t)
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: json.RawMessage(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	build := func(a store.Agent, e store.Environment) (store.Session, error) {
		return store.Session{Agent: a.Spec, Metadata: map[string]string{"env": e.Name}}, nil
	}
	got, err := s.Sessions().CreateFrom(ctx, ag.ID, 0, env.ID, build)
	if err != nil || got.AgentID != ag.ID || got.AgentVersion != 1 || got.EnvironmentID != env.ID || got.Metadata["env"] != "e" {
		t.Fatalf("CreateFrom: %+v, %v", got, err)
	}
	if _, err := s.Sessions().CreateFrom(ctx, ag.ID, 2, env.ID, build); !errdefs.IsNotFound(err) {
		t.Fatalf("missing version: %v", err)
	}
	if _, err := s.Sessions().CreateFrom(other, ag.ID, 0, env.ID, build); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant: %v", err)
	}
	if _, err := s.Sessions().CreateFrom(ctx, ag.ID, 0, "env_missing", build); !errdefs.IsNotFound(err) {
		t.Fatalf("missing environment: %v", err)
	}
	// build's error aborts the create.
	_, err = s.Sessions().CreateFrom(ctx, ag.ID, 0, env.ID, func(store.Agent, store.Environment) (store.Session, error) {
		return store.Session{}, errdefs.InvalidArgument("no")
	})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("build error: %v", err)
	}
	if list, _, _ := s.Sessions().List(ctx, store.SessionListOptions{}); len(list) != 1 {
		t.Fatalf("%d sessions, want 1", len(list))
	}
}

// CreateOnce: concurrent creates under one key make one session; a key is
// the tenant's own (another tenant's same key makes its own session); a
// retry finds its original, and a deleted session frees its key.
func TestSessionCreateOnce(t *testing.T) {
	s, ctx, other := setupResources(t)
	build := func(a store.Agent, e store.Environment) (store.Session, error) {
		return store.Session{Agent: a.Spec}, nil
	}
	fixtures := func(ctx context.Context) (string, string) {
		ag, err := s.Agents().Create(ctx, "a", spec("x"))
		if err != nil {
			t.Fatal(err)
		}
		env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: json.RawMessage(`{}`), Scope: "organization"})
		if err != nil {
			t.Fatal(err)
		}
		return ag.ID, env.ID
	}
	ag, env := fixtures(ctx)
	once := store.Once{Key: "k", Request: sha256.Sum256([]byte("request"))}
	const n = 8
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			got, _, err := s.Sessions().CreateOnce(ctx, once, ag, 0, env, build)
			if err != nil {
				t.Errorf("CreateOnce: %v", err)
			}
			ids <- got.ID
		})
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Errorf("concurrent creates under one key made %s and %s", first, id)
		}
	}
	if list, _, _ := s.Sessions().List(ctx, store.SessionListOptions{}); len(list) != 1 {
		t.Fatalf("%d sessions, want 1", len(list))
	}
	// A different request under the key.
	if _, _, err := s.Sessions().CreateOnce(ctx, store.Once{Key: "k", Request: sha256.Sum256([]byte("other"))}, ag, 0, env, build); !errdefs.IsConflict(err) {
		t.Fatalf("a different request under a used key: %v", err)
	}
	// Another tenant's same key and request: its own session.
	agB, envB := fixtures(other)
	b, existing, err := s.Sessions().CreateOnce(other, once, agB, 0, envB, build)
	if err != nil || existing || b.ID == first {
		t.Fatalf("another tenant's key: %+v, existing %v, %v", b, existing, err)
	}
	// A retry finds its original; a request that is not one does not.
	plain := store.Once{Request: sha256.Sum256([]byte("plain"))}
	p1, _, err := s.Sessions().CreateOnce(ctx, plain, ag, 0, env, build)
	if err != nil {
		t.Fatal(err)
	}
	p2, existing, err := s.Sessions().CreateOnce(ctx, plain, ag, 0, env, build)
	if err != nil || existing || p2.ID == p1.ID {
		t.Fatalf("a second plain create: %s (existing %v), %v", p2.ID, existing, err)
	}
	retry := plain
	retry.RetryOf = time.Minute
	p3, existing, err := s.Sessions().CreateOnce(ctx, retry, ag, 0, env, build)
	if err != nil || !existing || p3.ID != p2.ID {
		t.Fatalf("a retry got %s (existing %v), want %s: %v", p3.ID, existing, p2.ID, err)
	}
	// Deleting the session frees its key.
	if err := s.Sessions().Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	again, existing, err := s.Sessions().CreateOnce(ctx, once, ag, 0, env, build)
	if err != nil || existing || again.ID == first {
		t.Fatalf("the key after its session was deleted: %s (existing %v), %v", again.ID, existing, err)
	}
}

// stats.active_seconds counts the time a session spends running: each
// run is added when the status leaves running, and a read of a running
// session adds the run so far; idle time is not counted. Time is moved by
// putting running_since back, never by waiting.
func TestSessionActiveSeconds(t *testing.T) {
	s, db, ctx, _ := setupResourcesDB(t)
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: json.RawMessage(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Sessions().CreateFrom(ctx, ag.ID, 0, env.ID, func(a store.Agent, _ store.Environment) (store.Session, error) {
		return store.Session{Agent: a.Spec}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	status := func(st string) {
		t.Helper()
		n++
		id := fmt.Sprintf("sevt_%d", n)
		ev := store.NewEvent{ID: id, Type: "session.status_" + st, Body: []byte(`{"id":"` + id + `","type":"session.status_` + st + `"}`)}
		if _, err := s.Events().Append(ctx, sess.ID, store.Append{Events: []store.NewEvent{ev}, Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	active := func() float64 {
		t.Helper()
		got, err := s.Sessions().Get(ctx, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.ActiveSeconds
	}
	back := func(d string) {
		t.Helper()
		exec(t, db.SuperuserURL, `UPDATE sessions SET running_since = running_since - $2::interval WHERE id = $1`, sess.ID, d)
	}
	if a := active(); a != 0 {
		t.Fatalf("a new session has been active %v s", a)
	}
	status("running")
	back("10 seconds")
	if a := active(); a < 10 || a > 70 {
		t.Fatalf("running for 10 s: active %v s", a)
	}
	status("running") // another event while running: the run goes on
	back("5 seconds")
	status("idle")
	first := active()
	if first < 15 || first > 75 {
		t.Fatalf("after a 15 s run: active %v s", first)
	}
	// Idle time is not counted.
	exec(t, db.SuperuserURL, `UPDATE sessions SET updated_at = updated_at - interval '1 hour' WHERE id = $1`, sess.ID)
	if a := active(); a != first {
		t.Fatalf("idle: active went from %v to %v s", first, a)
	}
	status("running")
	back("20 seconds")
	status("terminated")
	if a := active(); a < first+20 || a > first+80 {
		t.Fatalf("after a second, 20 s run: active %v s (first run %v s)", a, first)
	}
}
