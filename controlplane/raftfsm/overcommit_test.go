package raftfsm

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
)

// A placement reserves its request and carries its limits; the FSM keeps
// each tenant's reservation per host through place, move, release and a
// snapshot, and refuses a tenant past its share of a host at commit.
func TestRequestsLimitsAndTenantShare(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{HostSharePercent: 50}, 0)
	for _, id := range []string{"h1", "h2"} {
		must(t, apply(CmdRegisterHost, "", schedulertest.Host(id, 1000, 4096)))
	}
	request := scheduler.Resources{CPUMillis: 100, MemoryMiB: 64}
	limits := scheduler.Resources{CPUMillis: 1000, MemoryMiB: 1024}
	pl := func(key, tenant, host string) scheduler.Plan {
		return scheduler.Plan{SessionID: key, Tenant: tenant, HostID: host, Runtime: "runsc", Resources: request, Limits: limits}
	}
	for i, key := range []string{"a1", "a2", "a3", "a4", "a5"} {
		must(t, apply(CmdPlace, "", PlacePayload{Plan: pl(key, "ta", "h1")}))
		if i == 0 {
			f.Read(func(v View) {
				p, _ := v.Placement(key)
				if p.Resources != request || p.Limits != limits || p.LimitsOrRequest() != limits {
					t.Fatalf("placement %+v: want request %+v and limits %+v", p, request, limits)
				}
			})
		}
	}
	// Tenant ta holds 500m of h1's 1000m: its next is over its share there,
	// tenant tb's is not.
	if r := apply(CmdPlace, "", PlacePayload{Plan: pl("a6", "ta", "h1")}); r.Err == nil || r.Err.Kind != errdefs.ConflictKind {
		t.Fatalf("tenant ta past its share of h1: %+v, want a conflict", r.Err)
	}
	must(t, apply(CmdPlace, "", PlacePayload{Plan: pl("b1", "tb", "h1")}))
	// Planned in the FSM (no plan from the proposer), ta's next goes to h2.
	req := scheduler.Request{SessionID: "a6", Tenant: "ta", Runtime: "runsc", Resources: request, Limits: limits}
	r := apply(CmdPlace, "", PlacePayload{Request: &req, Config: &scheduler.Config{}})
	must(t, r)
	var got scheduler.Placement
	if err := json.Unmarshal(r.Value, &got); err != nil || got.HostID != "h2" || got.Limits != limits {
		t.Fatalf("ta's sixth: %+v %v, want h2 with its limits", got, err)
	}
	onH1 := func(v View) (ta, tb scheduler.Resources) {
		return v.TenantAllocated("h1", "ta"), v.TenantAllocated("h1", "tb")
	}
	f.Read(func(v View) {
		if ta, tb := onH1(v); ta.CPUMillis != 500 || tb.CPUMillis != 100 {
			t.Fatalf("on h1: ta %+v tb %+v", ta, tb)
		}
	})
	// A move keeps the limits and moves the tenant's reservation.
	must(t, apply(CmdMovePlacement, "", MovePayload{SessionID: "a1", From: "h1",
		Plan: scheduler.Plan{SessionID: "a1", Tenant: "ta", HostID: "h2", Runtime: "runsc", Resources: request}}))
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "b1"}))
	f.Read(func(v View) {
		if ta, tb := onH1(v); ta.CPUMillis != 400 || tb != (scheduler.Resources{}) {
			t.Fatalf("on h1 after a move and a release: ta %+v tb %+v", ta, tb)
		}
		if v.TenantAllocated("h2", "ta").CPUMillis != 200 {
			t.Fatalf("on h2: %+v", v.TenantAllocated("h2", "ta"))
		}
		if p, _ := v.Placement("a1"); p.Limits != limits {
			t.Fatalf("moved placement lost its limits: %+v", p)
		}
	})
	// A snapshot restores the index and the limits.
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := NewFSM(scheduler.Quota{HostSharePercent: 50}, 0)
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	g.Read(func(v View) {
		if ta, _ := onH1(v); ta.CPUMillis != 400 || v.TenantAllocated("h2", "ta").CPUMillis != 200 {
			t.Fatalf("restored index: h1 %+v h2 %+v", ta, v.TenantAllocated("h2", "ta"))
		}
		if p, _ := v.Placement("a2"); p.Limits != limits {
			t.Fatalf("restored placement %+v", p)
		}
	})
}

// A tenant's own quota (an operator's override names no share) keeps the
// default's host share.
func TestTenantQuotaKeepsDefaultShare(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{ConcurrentSandboxes: 20, HostSharePercent: 50}, 0)
	must(t, apply(CmdSetQuota, "", SetQuotaPayload{Tenant: "ta", Quota: scheduler.Quota{ConcurrentSandboxes: 100}}))
	f.Read(func(v View) {
		if q := v.Quota("ta"); q.ConcurrentSandboxes != 100 || q.HostSharePercent != 50 {
			t.Fatalf("quota %+v", q)
		}
	})
}

// A placement as clusters stored it before requests and limits were apart
// (no "limits") reads back with its resources as its limits, and a host
// without "offered" reads back as it was.
func TestOldPlacementJSON(t *testing.T) {
	var p scheduler.Placement
	old := `{"session_key":"sesn_1","tenant":"t","host_id":"h","sandbox_id":"sbx-1","resources":{"cpu_millis":1000,"memory_mib":1024,"disk_mib":1024},"runtime":"gvisor","pids":256,"ready":true}`
	if err := json.Unmarshal([]byte(old), &p); err != nil {
		t.Fatal(err)
	}
	want := scheduler.Resources{CPUMillis: 1000, MemoryMiB: 1024, DiskMiB: 1024}
	if p.Limits != (scheduler.Resources{}) || p.LimitsOrRequest() != want || p.Resources != want {
		t.Fatalf("old placement %+v", p)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"limits"`)) {
		t.Errorf("a placement without limits writes them: %s", b)
	}
	var h scheduler.Host
	if err := json.Unmarshal([]byte(`{"id":"h","status":"ready","eligible":true,"capacity":{"cpu_millis":2000},"allocated":{}}`), &h); err != nil || h.Capacity.CPUMillis != 2000 {
		t.Fatalf("old host %+v %v", h, err)
	}
}
