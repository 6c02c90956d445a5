package raftfsm

import (
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
)

// TestSetHostHealth: a failing provider or condition keeps new placements
// off the host (at commit too, whatever the plan said), the existing ones
// stay; recovery lets them in again; a host that registers again keeps
// its conditions but not the heartbeat's, and its providers' times.
func TestSetHostHealth(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	h := schedulertest.Host("h1", 4000, 8192)
	h.Offers = []scheduler.Provider{{Name: "runsc", Isolation: "user_kernel", Healthy: true, Since: t0}}
	must(t, apply(CmdRegisterHost, "", h))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}))

	if r := apply(CmdSetHostHealth, "", HostHealthPayload{HostID: "nope"}); errdefs.KindOf(r.Error()) != errdefs.NotFoundKind {
		t.Fatalf("health of an unknown host: %v", r.Error())
	}
	t1 := t0.Add(time.Minute)
	must(t, apply(CmdSetHostHealth, "", HostHealthPayload{HostID: "h1",
		Providers: []ProviderHealth{{Name: "runsc", Reason: "canary: runsc exited 1", Since: t1}, {Name: "unknown", Since: t1}}}))
	p2 := plan("s2", "t1", "h1", 1000)
	p2.Runtime = "runsc"
	if r := apply(CmdPlace, "", PlacePayload{Plan: p2}); errdefs.KindOf(r.Error()) != errdefs.ConflictKind {
		t.Fatalf("a placement on a failing provider: %v, want a conflict", r.Error())
	}
	f.Read(func(v View) {
		h, _ := v.Host("h1")
		o, _ := h.Offer("runsc")
		if o.Healthy || o.Reason != "canary: runsc exited 1" || !o.Since.Equal(t1) || len(h.Offers) != 1 || !v.HasPlacementOn("h1", "s1") {
			t.Fatalf("after the canary failed: offers %+v, s1 placed %v", h.Offers, v.HasPlacementOn("h1", "s1"))
		}
	})
	must(t, apply(CmdSetHostHealth, "", HostHealthPayload{HostID: "h1",
		Providers:  []ProviderHealth{{Name: "runsc", Healthy: true, Since: t1}},
		Conditions: []scheduler.Condition{{Type: "memory_pressure", Reason: "2% available", Since: t1}, {Type: "disk_pressure", OK: true, Since: t1}}}))
	if r := apply(CmdPlace, "", PlacePayload{Plan: p2}); errdefs.KindOf(r.Error()) != errdefs.ConflictKind {
		t.Fatalf("a placement under memory pressure: %v, want a conflict", r.Error())
	}
	must(t, apply(CmdSetHostHealth, "", HostHealthPayload{HostID: "h1", Conditions: []scheduler.Condition{
		{Type: "memory_pressure", OK: true, Since: t1}, {Type: scheduler.ConditionHeartbeat, Reason: "none for 30s", Since: t1}}}))
	// Registering again: the reported conditions stay, the heartbeat's
	// goes; an unchanged provider keeps its since.
	h.Offers = []scheduler.Provider{{Name: "runsc", Healthy: true, Since: t1.Add(time.Hour)}}
	must(t, apply(CmdRegisterHost, "", h))
	f.Read(func(v View) {
		h, _ := v.Host("h1")
		if _, ok := h.Condition(scheduler.ConditionHeartbeat); ok || len(h.Conditions) != 2 || !h.Healthy() {
			t.Fatalf("conditions after registering again: %+v", h.Conditions)
		}
		if o, _ := h.Offer("runsc"); !o.Since.Equal(t1) {
			t.Fatalf("provider since after registering again: %v, want %v", o.Since, t1)
		}
	})
	must(t, apply(CmdPlace, "", PlacePayload{Plan: p2}))
}
