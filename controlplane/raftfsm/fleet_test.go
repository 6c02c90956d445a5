package raftfsm

import (
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/seal"
)

func TestJoinTokens(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hash := func(c string) string { return strings.Repeat(c, 64) }
	must(t, apply(CmdAddJoinToken, "", AddJoinTokenPayload{Hash: hash("a"), Expires: now.Add(time.Hour), Now: now}))
	must(t, apply(CmdAddJoinToken, "", AddJoinTokenPayload{Hash: hash("b"), Expires: now.Add(time.Minute), Now: now}))
	tests := []struct {
		name string
		p    ConsumeJoinTokenPayload
		kind errdefs.Kind
	}{
		{"unknown", ConsumeJoinTokenPayload{Hash: hash("c"), HostID: "h1", Now: now}, errdefs.UnauthenticatedKind},
		{"expired", ConsumeJoinTokenPayload{Hash: hash("b"), HostID: "h1", Now: now.Add(2 * time.Minute)}, errdefs.UnauthenticatedKind},
		{"no host", ConsumeJoinTokenPayload{Hash: hash("a"), Now: now}, errdefs.InvalidArgumentKind},
		{"ok", ConsumeJoinTokenPayload{Hash: hash("a"), HostID: "h1", Now: now}, errdefs.Unknown},
		{"used", ConsumeJoinTokenPayload{Hash: hash("a"), HostID: "h2", Now: now}, errdefs.UnauthenticatedKind},
		{"host already joined", ConsumeJoinTokenPayload{Hash: hash("b"), HostID: "h1", Now: now}, errdefs.AlreadyExistsKind},
	}
	for _, tt := range tests {
		r := apply(CmdConsumeJoinToken, "", tt.p)
		if got := errdefs.KindOf(r.Error()); got != tt.kind {
			t.Fatalf("%s: kind %v (%v), want %v", tt.name, got, r.Error(), tt.kind)
		}
	}
	f.Read(func(v View) {
		if a, _ := v.JoinToken(hash("a")); a.UsedBy != "h1" {
			t.Fatalf("token a %+v", a)
		}
		if b, ok := v.JoinToken(hash("b")); !ok || b.UsedBy != "" {
			t.Fatalf("refused consumption changed token b: %+v", b)
		}
	})
	// Adding a token forgets the expired ones.
	must(t, apply(CmdAddJoinToken, "", AddJoinTokenPayload{Hash: hash("d"), Expires: now.Add(3 * time.Hour), Now: now.Add(2 * time.Hour)}))
	f.Read(func(v View) {
		if _, ok := v.JoinToken(hash("b")); ok {
			t.Fatal("expired token kept")
		}
	})
	if r := apply(CmdAddJoinToken, "", AddJoinTokenPayload{Hash: "short", Expires: now.Add(time.Hour), Now: now}); !errdefs.IsInvalidArgument(r.Error()) {
		t.Fatalf("bad hash: %v", r.Error())
	}
}

func TestHostCAFirstWins(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	if r := apply(CmdSetHostCA, "", HostCA{}); !errdefs.IsInvalidArgument(r.Error()) {
		t.Fatalf("empty CA: %v", r.Error())
	}
	must(t, apply(CmdSetHostCA, "", HostCA{CertPEM: []byte("c1"), Key: seal.Sealed{KeyID: "k1", Data: []byte("k1")}}))
	var got HostCA
	if err := apply(CmdSetHostCA, "", HostCA{CertPEM: []byte("c2"), Key: seal.Sealed{KeyID: "k2", Data: []byte("k2")}}).Decode(&got); err != nil || string(got.CertPEM) != "c1" {
		t.Fatalf("second CA: %+v %v", got, err)
	}
	f.Read(func(v View) {
		if v.HostCA().Key.KeyID != "k1" {
			t.Fatal("CA replaced")
		}
	})
}

func TestMovePlacement(t *testing.T) {
	tests := []struct {
		name  string
		p     MovePayload
		kind  errdefs.Kind
		onto  string // where s1 is afterwards
		alloc [2]int64
	}{
		{"moves", MovePayload{SessionID: "s1", From: "h1", Plan: plan("s1", "t1", "h2", 1000)}, errdefs.Unknown, "h2", [2]int64{0, 1000}},
		{"wrong source", MovePayload{SessionID: "s1", From: "h3", Plan: plan("s1", "t1", "h2", 1000)}, errdefs.ConflictKind, "h1", [2]int64{1000, 0}},
		{"missing", MovePayload{SessionID: "nope", From: "h1", Plan: plan("nope", "t1", "h2", 1000)}, errdefs.NotFoundKind, "h1", [2]int64{1000, 0}},
		{"does not fit", MovePayload{SessionID: "s1", From: "h1", Plan: plan("s1", "t1", "h2", 9000)}, errdefs.ConflictKind, "h1", [2]int64{1000, 0}},
		{"onto its own host", MovePayload{SessionID: "s1", From: "h1", Plan: plan("s1", "t1", "h1", 1000)}, errdefs.ConflictKind, "h1", [2]int64{1000, 0}},
		{"other tenant", MovePayload{SessionID: "s1", From: "h1", Plan: plan("s1", "t2", "h2", 1000)}, errdefs.InvalidArgumentKind, "h1", [2]int64{1000, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Quota of one sandbox: a move must not count the session twice.
			f, apply := fsmSetup(t, scheduler.Quota{ConcurrentSandboxes: 1}, 0)
			must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
			must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 8192)))
			must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}))
			r := apply(CmdMovePlacement, "", tt.p)
			if got := errdefs.KindOf(r.Error()); got != tt.kind {
				t.Fatalf("kind %v (%v), want %v", got, r.Error(), tt.kind)
			}
			f.Read(func(v View) {
				p, _ := v.Placement("s1")
				h1, _ := v.Host("h1")
				h2, _ := v.Host("h2")
				if p.HostID != tt.onto || !v.HasPlacementOn(tt.onto, "s1") || len(v.HostPlacements(tt.onto)) != 1 ||
					[2]int64{h1.Allocated.CPUMillis, h2.Allocated.CPUMillis} != tt.alloc || v.Usage("t1").Sandboxes != 1 {
					t.Fatalf("placement %+v, h1 %+v, h2 %+v, usage %+v", p, h1.Allocated, h2.Allocated, v.Usage("t1"))
				}
			})
		})
	}
}

func TestReRegisterKeepsOperatorState(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	must(t, apply(CmdSetHostStatus, "", HostStatusPayload{ID: "h1", Eligible: ptr(false), Draining: ptr(true), Status: ptr(scheduler.StatusDown)}))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	f.Read(func(v View) {
		if h, _ := v.Host("h1"); h.Eligible || !h.Draining || h.Status != scheduler.StatusReady {
			t.Fatalf("host %+v", h)
		}
	})
}

func TestSnapshotKeepsHostProtocolState(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	now := time.Now()
	must(t, apply(CmdSetHostCA, "", HostCA{CertPEM: []byte("c"), Key: seal.Sealed{KeyID: "k", Data: []byte("k")}}))
	must(t, apply(CmdAddJoinToken, "", AddJoinTokenPayload{Hash: strings.Repeat("e", 64), Expires: now.Add(time.Hour), Now: now}))
	must(t, apply(CmdSetHostEndpoint, "", HostEndpointPayload{NodeID: "n1", Addr: "127.0.0.1:7"}))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}))
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
	g.Read(func(v View) {
		if v.HostCA() == nil || v.HostEndpoint("n1") != "127.0.0.1:7" || !v.HasPlacementOn("h1", "s1") {
			t.Fatal("host protocol state lost in the snapshot")
		}
		if _, ok := v.JoinToken(strings.Repeat("e", 64)); !ok {
			t.Fatal("join token lost")
		}
		if !reflect.DeepEqual(v.f.byHost, f.byHost) {
			t.Fatal("host index differs")
		}
	})
}

// A placement's life after it is made: the host's readiness reports apply
// only to the sandbox they name; a mover's fence is exclusive until it
// lapses and only its owner lifts it; a move makes the sandbox not ready
// and carries the mover's fence; the mover's lift records how it moved.
func TestReadinessAndFences(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 8192)))
	req := scheduler.Request{SessionID: "s1", Tenant: "t1", Resources: scheduler.Resources{CPUMillis: 500}}
	cfg := scheduler.Config{}
	// No plan: the FSM plans (the proposer's state had no host).
	var p scheduler.Placement
	if err := apply(CmdPlace, "", PlacePayload{Request: &req, Config: &cfg}).Decode(&p); err != nil || p.HostID == "" || p.Ready {
		t.Fatalf("placing without a plan: %+v %v", p, err)
	}
	placement := func() scheduler.Placement {
		var got scheduler.Placement
		f.Read(func(v View) { got, _ = v.Placement("s1") })
		return got
	}
	other := map[string]string{"h1": "h2", "h2": "h1"}[p.HostID]
	must(t, apply(CmdSetReady, "", ReadyPayload{SessionID: "s1", HostID: other, SandboxID: p.SandboxID, Ready: true}))
	must(t, apply(CmdSetReady, "", ReadyPayload{SessionID: "s1", HostID: p.HostID, SandboxID: "sbx-old", Ready: true}))
	if placement().Ready {
		t.Fatal("a report about another host's or sandbox's sandbox made it ready")
	}
	must(t, apply(CmdSetReady, "", ReadyPayload{SessionID: "s1", HostID: p.HostID, SandboxID: p.SandboxID, Ready: true}))
	if !placement().Ready {
		t.Fatal("not ready after its host's report")
	}

	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	fence := func(cmd CommandType, owner string, until, at time.Time) error {
		return apply(cmd, "", FencePayload{SessionID: "s1", Owner: owner, Until: until, Now: at}).Error()
	}
	if err := fence(CmdSetFence, "a", now, now); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a fence ending now: %v", err)
	}
	if err := fence(CmdSetFence, "a", now.Add(time.Minute), now); err != nil {
		t.Fatal(err)
	}
	if err := fence(CmdSetFence, "b", now.Add(time.Minute), now.Add(time.Second)); !errdefs.IsConflict(err) {
		t.Fatalf("a second mover while the first holds: %v", err)
	}
	if err := fence(CmdLiftFence, "b", time.Time{}, now); err != nil || placement().Fence == nil {
		t.Fatalf("another owner lifted the fence: %v %+v", err, placement().Fence)
	}
	if err := fence(CmdSetFence, "b", now.Add(3*time.Minute), now.Add(2*time.Minute)); err != nil {
		t.Fatalf("taking a lapsed fence: %v", err)
	}
	if fc := placement().Fence; fc == nil || fc.Owner != "b" || !fc.Holds(now.Add(2*time.Minute)) || fc.Holds(now.Add(3*time.Minute)) {
		t.Fatalf("fence %+v", fc)
	}
	var moved scheduler.Placement
	plan := scheduler.Plan{SessionID: "s1", Tenant: "t1", HostID: other, Resources: p.Resources}
	if err := apply(CmdMovePlacement, "", MovePayload{SessionID: "s1", From: p.HostID, Plan: plan, Fence: placement().Fence}).Decode(&moved); err != nil {
		t.Fatal(err)
	}
	if moved.HostID != other || moved.Ready || moved.Fence == nil || moved.Fence.Owner != "b" || moved.SandboxID == p.SandboxID {
		t.Fatalf("moved %+v", moved)
	}
	if err := apply(CmdLiftFence, "", FencePayload{SessionID: "s1", Owner: "b", Now: now, Moved: scheduler.MovedLive}).Error(); err != nil || placement().Fence != nil {
		t.Fatalf("lifting: %v %+v", err, placement().Fence)
	}
	if got := placement().Moved; got != scheduler.MovedLive {
		t.Fatalf("the lift at the end of a live move recorded Moved %q", got)
	}
	// The next move forgets how the last one came.
	plan.HostID = p.HostID
	if err := apply(CmdMovePlacement, "", MovePayload{SessionID: "s1", From: other, Plan: plan}).Decode(&moved); err != nil || moved.Moved != "" {
		t.Fatalf("moved back: %+v %v", moved, err)
	}
}

// Waiters wake on the change they wait for, with no polling: Wait returns
// once its condition holds after an apply, and WaitApplied once the index
// is applied.
func TestWaitersWakeOnApply(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	ch := f.Changed()
	select {
	case <-ch:
		t.Fatal("changed before any apply")
	default:
	}
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	select {
	case <-ch:
	default:
		t.Fatal("an apply did not close the channel taken before it")
	}
	if f.Applied() != 1 {
		t.Fatalf("applied %d", f.Applied())
	}
}

// TestWarmCounts: a host's warm pool counts (SetWarm, from its heartbeats)
// move the next placement of their image and runtime onto it; the
// placement counts one warm sandbox as taken until the next report, so the
// one after goes by bin-packing again; a re-register keeps the counts.
func TestWarmCounts(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 8192)))
	key := scheduler.WarmKey("img", "runsc")
	must(t, apply(CmdSetWarm, "", WarmPayload{HostID: "h2", Warm: map[string]int{key: 1}}))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 8192)))
	place := func(session string) string {
		t.Helper()
		req := &scheduler.Request{SessionID: session, Tenant: "t1", Runtime: "runsc", Image: "img",
			Resources: scheduler.Resources{CPUMillis: 1000, MemoryMiB: 1024}}
		r := apply(CmdPlace, "", PlacePayload{Request: req, Config: &scheduler.DefaultConfig})
		must(t, r)
		var pl scheduler.Placement
		if err := r.Decode(&pl); err != nil {
			t.Fatal(err)
		}
		return pl.HostID
	}
	// Bin-packing alone would pick h1 (equal hosts, the lower id).
	if got := place("s1"); got != "h2" {
		t.Fatalf("s1 placed on %s, want h2, the warm one", got)
	}
	f.Read(func(v View) {
		if h, _ := v.Host("h2"); h.Warm[key] != 0 {
			t.Fatalf("h2's warm count after a placement = %d, want 0", h.Warm[key])
		}
	})
	// Bin-packing now prefers h2 (fuller): make h1 warm and see it win.
	must(t, apply(CmdSetWarm, "", WarmPayload{HostID: "h1", Warm: map[string]int{key: 2}}))
	if got := place("s2"); got != "h1" {
		t.Fatalf("s2 placed on %s, want h1, the warm one", got)
	}
	must(t, apply(CmdSetWarm, "", WarmPayload{HostID: "h1"}))
	f.Read(func(v View) {
		if h, _ := v.Host("h1"); h.Warm != nil {
			t.Fatalf("h1's warm counts after an empty report = %v", h.Warm)
		}
	})
	if got := errdefs.KindOf(apply(CmdSetWarm, "", WarmPayload{HostID: "nope", Warm: map[string]int{key: 1}}).Error()); got != errdefs.NotFoundKind {
		t.Fatalf("SetWarm of an unknown host: %v", got)
	}
	if got := errdefs.KindOf(apply(CmdSetWarm, "", WarmPayload{HostID: "h1", Warm: map[string]int{key: -1}}).Error()); got != errdefs.InvalidArgumentKind {
		t.Fatalf("SetWarm with a negative count: %v", got)
	}
}
