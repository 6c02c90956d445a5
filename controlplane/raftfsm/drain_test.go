package raftfsm

import (
	"io"
	"reflect"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
)

// A drain's record: started once (a second start returns the first),
// counted step by step with its steps bounded, ended, kept in snapshots,
// and gone when the host is uncordoned.
func TestDrainRecord(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "h1", 500)}))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s2", "t1", "h1", 500)}))
	start := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	if r := apply(CmdStartDrain, "", StartDrainPayload{HostID: "nope", Deadline: start.Add(time.Minute), MaxParallel: 1, Started: start}); errdefs.KindOf(r.Error()) != errdefs.NotFoundKind {
		t.Fatalf("a drain of an unknown host: %v", r.Error())
	}
	if r := apply(CmdStartDrain, "", StartDrainPayload{HostID: "h1", Started: start}); errdefs.KindOf(r.Error()) != errdefs.InvalidArgumentKind {
		t.Fatalf("a drain without deadline: %v", r.Error())
	}
	must(t, apply(CmdStartDrain, "", StartDrainPayload{HostID: "h1", Deadline: start.Add(time.Minute), MaxParallel: 3, Started: start}))
	must(t, apply(CmdStartDrain, "", StartDrainPayload{HostID: "h1", Deadline: start.Add(time.Hour), MaxParallel: 9, Started: start.Add(time.Second)}))
	read := func() (d Drain, ok bool, h scheduler.Host) {
		f.Read(func(v View) {
			d, ok = v.Drain("h1")
			hp, _ := v.Host("h1")
			h = *hp
		})
		return
	}
	d, ok, h := read()
	if !ok || !d.Running() || d.Total != 2 || d.MaxParallel != 3 || !d.Deadline.Equal(start.Add(time.Minute)) || h.Eligible || !h.Draining {
		t.Fatalf("started: %+v %v, host %+v", d, ok, h)
	}
	must(t, apply(CmdDrainStep, "", DrainStepPayload{HostID: "h1", Step: DrainStep{SessionID: "s1", State: "retrying"}}))
	must(t, apply(CmdDrainStep, "", DrainStepPayload{HostID: "h1", Step: DrainStep{SessionID: "s1", State: "moved_live", To: "h2"}}))
	for range maxDrainSteps {
		must(t, apply(CmdDrainStep, "", DrainStepPayload{HostID: "h1", Step: DrainStep{SessionID: "s2", State: "retrying"}}))
	}
	must(t, apply(CmdDrainStep, "", DrainStepPayload{HostID: "h1", Step: DrainStep{SessionID: "s2", State: "evicted"}}))
	d, _, _ = read()
	if d.Seq != maxDrainSteps+3 || len(d.Steps) != maxDrainSteps || d.Moved != 1 || d.MovedLive != 1 || d.Evicted != 1 || d.Remaining() != 0 {
		t.Fatalf("after the steps: seq %d, %d steps kept, %+v", d.Seq, len(d.Steps), d)
	}
	if after := d.After(d.Seq - 1); len(after) != 1 || after[0].State != "evicted" {
		t.Fatalf("the steps after %d: %+v", d.Seq-1, after)
	}
	must(t, apply(CmdEndDrain, "", EndDrainPayload{HostID: "h1", At: start.Add(30 * time.Second)}))
	if r := apply(CmdDrainStep, "", DrainStepPayload{HostID: "h1", Step: DrainStep{SessionID: "s2", State: "moved"}}); errdefs.KindOf(r.Error()) != errdefs.FailedPreconditionKind {
		t.Fatalf("a step after the end: %v", r.Error())
	}
	var running []Drain
	f.Read(func(v View) { running = v.RunningDrains() })
	if d, _, _ = read(); d.Running() || len(running) != 0 {
		t.Fatalf("ended: %+v, running %+v", d, running)
	}

	// Snapshots carry it.
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	g := NewFSM(scheduler.Quota{}, 0)
	if err := g.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	var restored Drain
	g.Read(func(v View) { restored, _ = v.Drain("h1") })
	if !reflect.DeepEqual(restored, d) {
		t.Fatalf("restored drain differs:\n%+v\n%+v", restored, d)
	}

	// A finished drain is replaced by a new one; an uncordon forgets it.
	must(t, apply(CmdStartDrain, "", StartDrainPayload{HostID: "h1", Deadline: start.Add(time.Hour), MaxParallel: 1, Started: start.Add(time.Minute)}))
	if d, _, _ = read(); !d.Running() || d.Seq != 0 || !d.Started.Equal(start.Add(time.Minute)) {
		t.Fatalf("a new drain: %+v", d)
	}
	must(t, apply(CmdSetHostStatus, "", HostStatusPayload{ID: "h1", Eligible: ptr(true), Draining: ptr(false)}))
	if _, ok, _ = read(); ok {
		t.Fatal("the drain outlived the uncordon")
	}
}
