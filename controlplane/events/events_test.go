package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/agentloop/looptest"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var ctx = tenant.With(context.Background(), tenant.Default)

type pgHarness struct {
	db *pgtest.DB
	st *store.Store
}

func newHarness(t testing.TB) *pgHarness {
	t.Helper()
	db := pgtest.New(t)
	st, err := store.Open(context.Background(), db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return &pgHarness{db: db, st: st}
}

// CreateSession writes the rows a session needs directly, as the superuser:
// these tests are about the log, not the resources API.
func (h *pgHarness) CreateSession(t *testing.T, a agentloop.Agent) string {
	t.Helper()
	return h.createSession(t, a)
}

func (h *pgHarness) createSession(t testing.TB, a agentloop.Agent) string {
	t.Helper()
	id := "sesn_" + looptest.NewID()[5:]
	snap, _ := json.Marshal(a)
	c := context.Background()
	conn, err := pgx.Connect(c, h.db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(c)
	stmts := []string{
		`INSERT INTO agents (tenant_id, id, latest_version) VALUES ('tenant_default', 'agent_t', 1) ON CONFLICT DO NOTHING`,
		`INSERT INTO agent_versions (tenant_id, agent_id, version, name, spec) VALUES ('tenant_default', 'agent_t', 1, 't', '{}') ON CONFLICT DO NOTHING`,
		`INSERT INTO environments (tenant_id, id, name, config) VALUES ('tenant_default', 'env_t', 't', '{}') ON CONFLICT DO NOTHING`,
	}
	for _, s := range stmts {
		if _, err := conn.Exec(c, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	_, err = conn.Exec(c, `INSERT INTO sessions (tenant_id, id, agent_id, agent_version, agent, environment_id)
		VALUES ('tenant_default', $1, 'agent_t', 1, $2, 'env_t')`, id, snap)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (h *pgHarness) Send(t *testing.T, sessionID string, event map[string]any) string {
	t.Helper()
	id := looptest.NewID()
	event["id"] = id
	b, _ := json.Marshal(event)
	if _, err := h.st.Events().AppendClient(ctx, sessionID, []store.NewEvent{{ID: id, Type: event["type"].(string), Body: b}}); err != nil {
		t.Fatal(err)
	}
	return id
}

func (h *pgHarness) Status(t *testing.T, sessionID string) string {
	t.Helper()
	st, err := h.st.Events().LoopState(ctx, sessionID)
	if err != nil {
		t.Fatal(err)
	}
	return st.Status
}

// The PostgreSQL store passes the same loop scenarios as the in-memory one.
func TestLoopOnPostgres(t *testing.T) {
	looptest.RunSuite(t, func(t *testing.T) looptest.Harness { return harnessWithCtx{newHarness(t)} })
}

// harnessWithCtx puts the tenant in the context the suite's runner uses.
type harnessWithCtx struct{ *pgHarness }

func (h harnessWithCtx) Store() agentloop.Store { return tenantStore{events.LoopStore{St: h.st}} }

type tenantStore struct{ events.LoopStore }

func (s tenantStore) Load(c context.Context, id string) (agentloop.Agent, []agentloop.Event, error) {
	return s.LoopStore.Load(tenant.With(c, tenant.Default), id)
}

func (s tenantStore) LoadSince(c context.Context, id string, after int64) ([]agentloop.Event, error) {
	return s.LoopStore.LoadSince(tenant.With(c, tenant.Default), id, after)
}

func (s tenantStore) Queued(c context.Context, id string) ([]agentloop.Event, error) {
	return s.LoopStore.Queued(tenant.With(c, tenant.Default), id)
}

func (s tenantStore) Commit(c context.Context, id string, cm agentloop.Commit) error {
	return s.LoopStore.Commit(tenant.With(c, tenant.Default), id, cm)
}

func (s tenantStore) PinMCPTools(c context.Context, id, server string, tools []agentloop.MCPTool) error {
	return s.LoopStore.PinMCPTools(tenant.With(c, tenant.Default), id, server, tools)
}

func TestAppendIsOrderedAndNotifiesEveryNode(t *testing.T) {
	h := newHarness(t)
	id := h.CreateSession(t, agentloop.Agent{})

	// Two hubs stand for two control-plane nodes.
	run := func() *events.Hub {
		hub := events.NewHub(h.st, nil)
		c, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		done := make(chan struct{})
		go func() { hub.Run(c, ready); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			t.Fatal("hub did not start listening")
		}
		return hub
	}
	a, b := run(), run()
	subA, subB := a.Subscribe(id, true), b.Subscribe(id, false)
	defer subA.Close()
	defer subB.Close()

	first := h.Send(t, id, map[string]any{"type": "user.message", "content": []any{}})
	for _, sub := range []*events.Subscription{subA, subB} {
		select {
		case <-sub.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("a node was not told about the append")
		}
		latest, _, deleted, _, _ := sub.Pending()
		if latest != 1 || deleted {
			t.Fatalf("latest %d deleted %v, want 1 false", latest, deleted)
		}
	}
	got, err := h.st.Events().List(ctx, id, store.EventQuery{})
	if err != nil || len(got) != 1 || got[0].ID != first || got[0].ProcessedAt != nil {
		t.Fatalf("List = %+v, %v", got, err)
	}
	var body map[string]any
	if err := json.Unmarshal(got[0].JSON, &body); err != nil || body["processed_at"] != nil || body["id"] != first {
		t.Fatalf("stored JSON %s (%v): want processed_at null", got[0].JSON, err)
	}

	// Previews reach only subscribers that asked, in order with events.
	events.Previews{St: h.st}.Start(id, "sevt_x", "agent.message")
	events.Previews{St: h.st}.Delta(id, "sevt_x", 0, "hi")
	deadline := time.After(5 * time.Second)
	var deltas []events.Delta
	for len(deltas) < 2 {
		select {
		case <-subA.Ready():
			_, d, _, _, _ := subA.Pending()
			deltas = append(deltas, d...)
		case <-deadline:
			t.Fatalf("got %d previews, want 2", len(deltas))
		}
	}
	if deltas[0].AfterSeq != 1 || string(deltas[0].Frame) == "" {
		t.Fatalf("preview %+v", deltas[0])
	}
	if _, d, _, _, _ := subB.Pending(); len(d) != 0 {
		t.Fatal("a subscriber that did not ask for previews got them")
	}

	// Deleting the session (as the API does) announces it to every node.
	if err := h.st.Sessions().Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-subB.Ready():
		if _, _, deleted, _, _ := subB.Pending(); !deleted {
			t.Fatal("deletion not announced")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("deletion not announced")
	}
}

func TestTenantsCannotReadEachOthersLogs(t *testing.T) {
	h := newHarness(t)
	id := h.CreateSession(t, agentloop.Agent{})
	h.Send(t, id, map[string]any{"type": "user.message", "content": []any{}})
	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := pgx.Connect(c, h.db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(c)
	if _, err := conn.Exec(c, `INSERT INTO tenants (id, name) VALUES ('tenant_other', 'other')`); err != nil {
		t.Fatal(err)
	}
	other := tenant.With(context.Background(), "tenant_other")
	if _, err := h.st.Events().List(other, id, store.EventQuery{}); err == nil {
		t.Fatal("another tenant listed the session's events")
	}
	if _, err := h.st.Events().AppendClient(other, id, []store.NewEvent{{ID: "sevt_z", Type: "user.message", Body: []byte(`{}`)}}); err == nil {
		t.Fatal("another tenant appended to the session")
	}
}

// The events an agent loop's append commits reach this node's subscribers
// with their announcement (Hub.Appended), as the store then returns them:
// the same ids, order, sequence numbers and JSON, processed_at to the
// microsecond. A client's events, and anything after a gap, are not
// handed over: the reader reads those.
func TestAppendedEventsReachSubscribersAsStored(t *testing.T) {
	h := newHarness(t)
	id := h.CreateSession(t, agentloop.Agent{})
	hub := events.NewHub(h.st, nil)
	h.st.ObserveAppends(hub.Appended)
	t.Cleanup(func() { h.st.ObserveAppends(nil) })
	sub := hub.Subscribe(id, false)
	defer sub.Close()
	// A subscriber of previews reads every event: a preview comes by
	// notification after the commit of the event it previews.
	previews := hub.Subscribe(id, true)
	defer previews.Close()
	pending := func() (int64, []store.StoredEvent) {
		t.Helper()
		select {
		case <-sub.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("the subscriber was not told of the append")
		}
		latest, _, _, _, local := sub.Pending()
		return latest, local
	}

	h.Send(t, id, map[string]any{"type": "user.message", "content": []any{}}) // a client's: not handed over
	loop := func(n int) {
		t.Helper()
		var evs []store.NewEvent
		for i := range n {
			eid := store.NewEventID()
			body, _ := json.Marshal(map[string]any{"id": eid, "type": "agent.message", "content": []any{map[string]any{"type": "text", "text": fmt.Sprintf("part <%d> & é", i)}}})
			evs = append(evs, store.NewEvent{ID: eid, Type: "agent.message", Body: body})
		}
		if _, err := h.st.Events().Append(ctx, id, store.Append{Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	loop(3)
	latest, local := pending()
	if latest != 4 || len(local) != 3 {
		t.Fatalf("after a client's event and a loop's three: latest %d, %d handed over, want 4 and 3", latest, len(local))
	}
	loop(2)
	latest, more := pending()
	if latest != 6 || len(more) != 2 {
		t.Fatalf("after two more: latest %d, %d handed over", latest, len(more))
	}
	local = append(local, more...)
	stored, err := h.st.Events().List(ctx, id, store.EventQuery{})
	if err != nil || len(stored) != 6 {
		t.Fatalf("List = %d events, %v", len(stored), err)
	}
	for i, e := range local {
		want := stored[i+1]
		var got, was map[string]any
		if json.Unmarshal(e.JSON, &got) != nil || json.Unmarshal(want.JSON, &was) != nil {
			t.Fatalf("event %d: JSON %s, stored %s", i, e.JSON, want.JSON)
		}
		if e.Seq != want.Seq || e.ID != want.ID || e.Type != want.Type || !reflect.DeepEqual(got, was) || got["processed_at"] == nil {
			t.Errorf("handed over %d %s %s %s\nstored      %d %s %s %s", e.Seq, e.ID, e.Type, e.JSON, want.Seq, want.ID, want.Type, want.JSON)
		}
	}
	if _, _, _, _, local := previews.Pending(); len(local) != 0 {
		t.Fatalf("a subscriber of previews was handed %d events", len(local))
	}
	// A gap (another writer's events between two a subscriber holds)
	// hands over nothing more until the reader has taken what it holds.
	loop(1)
	h.Send(t, id, map[string]any{"type": "user.message", "content": []any{}})
	loop(1)
	if _, local := pending(); len(local) != 1 || local[0].Seq != 7 {
		t.Fatalf("across a gap: handed over %+v, want only seq 7", local)
	}
}
