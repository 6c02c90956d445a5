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

// The pools travel in the log entry: the FSM re-plans within them, a plan
// onto a host of another pool is refused at commit (a move's too), and the
// per-host count of a tenant's sandboxes (zone spread) follows place,
// move, release and a snapshot.
func TestPoolsAtCommit(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	for id, pool := range map[string]string{"a-dedicated": "dedicated", "b-shared": "shared", "c-shared": "shared"} {
		h := schedulertest.Host(id, 4000, 8192)
		h.Labels = map[string]string{scheduler.PoolLabel: pool}
		must(t, apply(CmdRegisterHost, "", h))
	}
	res := scheduler.Resources{CPUMillis: 100, MemoryMiB: 64}
	shared := []string{"", "shared"}
	// No plan from the proposer: the FSM plans, within the request's pools
	// (the dedicated host sorts first and would win otherwise).
	req := scheduler.Request{SessionID: "s1", Tenant: "t", Runtime: "runsc", Resources: res, Pools: shared}
	r := apply(CmdPlace, "", PlacePayload{Request: &req, Config: &scheduler.Config{}})
	must(t, r)
	var got scheduler.Placement
	if err := json.Unmarshal(r.Value, &got); err != nil || got.HostID != "b-shared" {
		t.Fatalf("planned in the FSM: %+v %v, want b-shared", got, err)
	}
	// A plan onto the dedicated host with the tenant's pools is refused;
	// with the request in the entry the FSM re-plans within them.
	bad := scheduler.Plan{SessionID: "s2", Tenant: "t", HostID: "a-dedicated", Runtime: "runsc", Resources: res, Pools: shared}
	if r := apply(CmdPlace, "", PlacePayload{Plan: bad}); r.Err == nil || r.Err.Kind != errdefs.ConflictKind {
		t.Fatalf("a plan onto another pool's host: %+v, want a conflict", r.Err)
	}
	req2 := scheduler.Request{SessionID: "s2", Tenant: "t", Runtime: "runsc", Resources: res, Pools: shared}
	r = apply(CmdPlace, "", PlacePayload{Plan: bad, Request: &req2, Config: &scheduler.Config{}})
	must(t, r)
	if err := json.Unmarshal(r.Value, &got); err != nil || got.HostID != "b-shared" {
		t.Fatalf("re-planned: %+v %v, want b-shared", got, err)
	}
	if r := apply(CmdMovePlacement, "", MovePayload{SessionID: "s1", From: "b-shared",
		Plan: scheduler.Plan{SessionID: "s1", Tenant: "t", HostID: "a-dedicated", Runtime: "runsc", Resources: res, Pools: shared}}); r.Err == nil || r.Err.Kind != errdefs.ConflictKind {
		t.Fatalf("a move onto another pool's host: %+v, want a conflict", r.Err)
	}
	must(t, apply(CmdMovePlacement, "", MovePayload{SessionID: "s1", From: "b-shared",
		Plan: scheduler.Plan{SessionID: "s1", Tenant: "t", HostID: "c-shared", Runtime: "runsc", Resources: res, Pools: shared}}))
	counts := func(v View) [2]int {
		return [2]int{v.TenantSandboxes("b-shared", "t"), v.TenantSandboxes("c-shared", "t")}
	}
	f.Read(func(v View) {
		if c := counts(v); c != [2]int{1, 1} {
			t.Fatalf("tenant t's sandboxes on b and c: %v, want 1 and 1", c)
		}
	})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s2"}))
	f.Read(func(v View) {
		if c := counts(v); c != [2]int{0, 1} {
			t.Fatalf("after a release: %v, want 0 and 1", c)
		}
	})
	g := NewFSM(scheduler.Quota{}, 0)
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	g.Read(func(v View) {
		if c := counts(v); c != [2]int{1, 1} {
			t.Fatalf("restored: %v, want 1 and 1", c)
		}
	})
}
