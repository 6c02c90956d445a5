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

// TestSetPausedReservesTheDiskItHolds: a paused placement whose host
// measured its sandbox keeps that much of the host's disk, not its whole
// disk request, so more fit beside it (what lets one host hold many
// paused sandboxes); resuming needs the whole request again, and one that
// holds more than its request (a checkpoint beside its disk image) keeps
// that and gives it back on resume. Unmeasured, the whole request stays.
func TestSetPausedReservesTheDiskItHolds(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	h := schedulertest.Host("h1", 100_000, 100_000)
	h.Capacity.DiskMiB = 2048
	must(t, apply(CmdRegisterHost, "", h))
	withDisk := func(session string) scheduler.Plan {
		p := plan(session, "t1", "h1", 100)
		p.Resources.DiskMiB = 1024
		return p
	}
	pause := func(session string, paused bool, diskMiB int64) Result {
		var p scheduler.Placement
		f.Read(func(v View) { p, _ = v.Placement(session) })
		return apply(CmdSetPaused, "", PausePayload{SessionID: session, HostID: p.HostID, SandboxID: p.SandboxID, Paused: paused, DiskMiB: diskMiB})
	}
	allocated := func() int64 {
		var d int64
		f.Read(func(v View) { h, _ := v.Host("h1"); d = h.Allocated.DiskMiB })
		return d
	}
	must(t, apply(CmdPlace, "", PlacePayload{Plan: withDisk("s1")}))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: withDisk("s2")}))
	if r := apply(CmdPlace, "", PlacePayload{Plan: withDisk("s3")}); r.Error() == nil {
		t.Fatal("a third 1 GiB sandbox fit on a 2 GiB disk")
	}
	must(t, pause("s1", true, 33))
	must(t, pause("s2", true, 0)) // not measured
	f.Read(func(v View) {
		if p, _ := v.Placement("s1"); p.PausedDiskMiB != 33 || p.Reserved() != (scheduler.Resources{DiskMiB: 33}) {
			t.Fatalf("paused s1: %+v reserves %+v", p, p.Reserved())
		}
	})
	if got := allocated(); got != 33+1024 {
		t.Fatalf("disk allocated with s1 paused (33 MiB held) and s2 paused unmeasured: %d MiB, want %d", got, 33+1024)
	}
	// With s2 gone, what s1 freed takes two more sandboxes (1024 and 990
	// MiB beside its 33); s1's request no longer fits until one goes.
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s2"}))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: withDisk("s3")}))
	s4 := withDisk("s4")
	s4.Resources.DiskMiB = 990
	must(t, apply(CmdPlace, "", PlacePayload{Plan: s4}))
	if r := pause("s1", false, 0); errdefs.KindOf(r.Error()) != errdefs.ResourceExhaustedKind {
		t.Fatalf("resuming s1 without room for its disk request: %v", r.Error())
	}
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s4"}))
	must(t, pause("s1", false, 0))
	if got := allocated(); got != 2048 {
		t.Fatalf("disk allocated with s1 resumed beside s3: %d MiB, want 2048", got)
	}
	f.Read(func(v View) {
		if p, _ := v.Placement("s1"); p.Paused() || p.PausedDiskMiB != 0 {
			t.Fatalf("resumed s1: %+v", p)
		}
	})
	// A paused sandbox holding more than its request keeps all it holds;
	// its resume needs no more than its request and gives the rest back.
	must(t, pause("s1", true, 1500))
	if got := allocated(); got != 1500+1024 {
		t.Fatalf("disk allocated with s1 paused holding 1500 MiB: %d MiB, want %d", got, 1500+1024)
	}
	must(t, pause("s1", false, 0))
	if got := allocated(); got != 2048 {
		t.Fatalf("disk allocated with s1 resumed from 1500 MiB: %d MiB, want 2048", got)
	}
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s1"}))
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s3"}))
	if got := allocated(); got != 0 {
		t.Fatalf("disk allocated after every release: %d MiB", got)
	}
}
