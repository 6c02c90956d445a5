package raftfsm

import (
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
)

// TestSetPaused: a paused placement reserves no CPU or memory on its host
// and counts apart in its tenant's usage (so another sandbox fits, within
// a one-sandbox quota); resuming takes them back only while they fit.
func TestSetPaused(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{ConcurrentSandboxes: 1}, 0)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 1000, 8192)))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}))
	var p1 scheduler.Placement
	f.Read(func(v View) { p1, _ = v.Placement("s1") })
	pause := func(session string, paused bool) Result {
		var p scheduler.Placement
		f.Read(func(v View) { p, _ = v.Placement(session) })
		return apply(CmdSetPaused, "", PausePayload{SessionID: session, HostID: p.HostID, SandboxID: p.SandboxID, Paused: paused})
	}
	if r := apply(CmdSetPaused, "", PausePayload{SessionID: "s1", HostID: "h1", SandboxID: "other", Paused: true}); errdefs.KindOf(r.Error()) != errdefs.ConflictKind {
		t.Fatalf("pausing a replaced sandbox: %v", r.Error())
	}
	must(t, pause("s1", true))
	must(t, pause("s1", true)) // idempotent
	f.Read(func(v View) {
		p, _ := v.Placement("s1")
		h, _ := v.Host("h1")
		u := v.Usage("t1")
		if !p.Paused() || h.Allocated.CPUMillis != 0 || h.Allocated.MemoryMiB != 0 || u.Sandboxes != 0 || u.PausedSandboxes != 1 || u.CPUMillis != 0 {
			t.Fatalf("paused: placement %+v, host allocated %+v, usage %+v", p, h.Allocated, u)
		}
	})
	// The freed CPU and quota take another session; s1 cannot resume then.
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s2", "t1", "h1", 1000)}))
	if r := pause("s1", false); errdefs.KindOf(r.Error()) != errdefs.ResourceExhaustedKind {
		t.Fatalf("resume on a full host: %v", r.Error())
	}
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s2"}))
	must(t, pause("s1", false))
	f.Read(func(v View) {
		p, _ := v.Placement("s1")
		h, _ := v.Host("h1")
		u := v.Usage("t1")
		if p.Paused() || p.SandboxID != p1.SandboxID || h.Allocated.CPUMillis != 1000 || u.Sandboxes != 1 || u.PausedSandboxes != 0 {
			t.Fatalf("resumed: placement %+v, host allocated %+v, usage %+v", p, h.Allocated, u)
		}
	})
	// Releasing a paused placement gives back exactly what it held.
	must(t, pause("s1", true))
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s1"}))
	f.Read(func(v View) {
		h, _ := v.Host("h1")
		if h.Allocated != (scheduler.Resources{}) || v.Usage("t1") != (scheduler.Usage{}) {
			t.Fatalf("after release: host allocated %+v, usage %+v", h.Allocated, v.Usage("t1"))
		}
	})
}
