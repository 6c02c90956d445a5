package raftfsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
)

// fsmSetup returns an FSM and a function applying commands to it at
// increasing log indexes.
func fsmSetup(t *testing.T, quota scheduler.Quota, maxRecent int) (*FSM, func(CommandType, string, any) Result) {
	t.Helper()
	f := NewFSM(quota, maxRecent)
	var index uint64
	return f, func(typ CommandType, key string, payload any) Result {
		t.Helper()
		c, err := NewCommand(typ, key, payload)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(c)
		index++
		return *f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: b}).(*Result)
	}
}

func plan(session, tenant, host string, cpu int64) scheduler.Plan {
	return scheduler.Plan{SessionID: session, Tenant: tenant, HostID: host, Runtime: "runsc",
		Resources: scheduler.Resources{CPUMillis: cpu, MemoryMiB: 512}}
}

func TestApplyTable(t *testing.T) {
	tests := []struct {
		name    string
		typ     CommandType
		payload any
		kind    errdefs.Kind // Unknown: success
		check   func(t *testing.T, v View)
	}{
		{"member", CmdMember, MemberPayload{ID: "n9", HTTPAddr: "127.0.0.1:1"}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if v.Member("n9") != "127.0.0.1:1" {
					t.Fatal("member not recorded")
				}
			}},
		{"member without id", CmdMember, MemberPayload{}, errdefs.InvalidArgumentKind, nil},
		{"register host", CmdRegisterHost, schedulertest.Host("h2", 1000, 1000), errdefs.Unknown,
			func(t *testing.T, v View) {
				if _, ok := v.Host("h2"); !ok || len(v.Hosts()) != 3 || v.Hosts()[2].ID != "h2" {
					t.Fatal("host not registered in order")
				}
			}},
		{"re-register keeps allocation", CmdRegisterHost, schedulertest.Host("h1", 8000, 1000), errdefs.Unknown,
			func(t *testing.T, v View) {
				h, _ := v.Host("h1")
				if h.Allocated.CPUMillis != 1000 || h.Capacity.CPUMillis != 8000 {
					t.Fatalf("host %+v", h)
				}
			}},
		{"host without id", CmdRegisterHost, scheduler.Host{}, errdefs.InvalidArgumentKind, nil},
		{"cordon", CmdSetHostStatus, HostStatusPayload{ID: "h1", Eligible: ptr(false), Draining: ptr(true)}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if h, _ := v.Host("h1"); h.Eligible || !h.Draining || h.Status != scheduler.StatusReady {
					t.Fatalf("host %+v", h)
				}
			}},
		{"status of missing host", CmdSetHostStatus, HostStatusPayload{ID: "nope", Status: ptr(scheduler.StatusDown)}, errdefs.NotFoundKind, nil},
		{"bad status", CmdSetHostStatus, HostStatusPayload{ID: "h1", Status: ptr(scheduler.HostStatus("weird"))}, errdefs.InvalidArgumentKind, nil},
		{"place", CmdPlace, PlacePayload{Plan: plan("s2", "t1", "h1", 1000)}, errdefs.Unknown,
			func(t *testing.T, v View) {
				p, ok := v.Placement("s2")
				if h, _ := v.Host("h1"); !ok || p.SandboxID == "" || h.Allocated.CPUMillis != 2000 || v.Usage("t1").Sandboxes != 2 {
					t.Fatalf("placement %+v host %+v usage %+v", p, h, v.Usage("t1"))
				}
			}},
		{"place same session same host", CmdPlace, PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if v.Usage("t1").Sandboxes != 1 {
					t.Fatal("placement duplicated")
				}
			}},
		{"place same session other host", CmdPlace, PlacePayload{Plan: plan("s1", "t1", "h2", 1000)}, errdefs.ConflictKind, nil},
		{"place overfills", CmdPlace, PlacePayload{Plan: plan("s2", "t1", "h1", 3500)}, errdefs.ConflictKind, nil},
		{"place over quota", CmdPlace, PlacePayload{Plan: plan("s2", "t2", "h1", 100)}, errdefs.ResourceExhaustedKind, nil},
		{"release", CmdRelease, ReleasePayload{SessionID: "s1"}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if h, _ := v.Host("h1"); h.Allocated.CPUMillis != 0 || v.Usage("t1").Sandboxes != 0 {
					t.Fatalf("host %+v usage %+v", h, v.Usage("t1"))
				}
			}},
		{"release missing", CmdRelease, ReleasePayload{SessionID: "nope"}, errdefs.NotFoundKind, nil},
		{"assign runner bumps epoch", CmdAssignRunner, AssignRunnerPayload{SessionID: "s1", NodeID: "n2"}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if a, _ := v.Runner("s1"); a.Epoch != 2 || a.NodeID != "n2" {
					t.Fatalf("assignment %+v", a)
				}
			}},
		{"assign runner if epoch matches", CmdAssignRunner, AssignRunnerPayload{SessionID: "s1", NodeID: "n3", IfEpoch: ptr(uint64(1))}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if a, _ := v.Runner("s1"); a.Epoch != 2 || a.NodeID != "n3" {
					t.Fatalf("assignment %+v", a)
				}
			}},
		{"assign runner if epoch is stale", CmdAssignRunner, AssignRunnerPayload{SessionID: "s1", NodeID: "n3", IfEpoch: ptr(uint64(0))}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if a, _ := v.Runner("s1"); a.Epoch != 1 || a.NodeID != "n1" {
					t.Fatalf("a compare-and-set on a stale epoch changed the assignment: %+v", a)
				}
			}},
		{"assign runner without node", CmdAssignRunner, AssignRunnerPayload{SessionID: "s1"}, errdefs.InvalidArgumentKind, nil},
		{"set quota", CmdSetQuota, SetQuotaPayload{Tenant: "t3", Quota: scheduler.Quota{CPUMillis: 5}}, errdefs.Unknown,
			func(t *testing.T, v View) {
				if v.Quota("t3").CPUMillis != 5 || v.Quota("t1") != (scheduler.Quota{ConcurrentSandboxes: 10}) {
					t.Fatal("quota not set")
				}
			}},
		{"quota below usage", CmdSetQuota, SetQuotaPayload{Tenant: "t1", Quota: scheduler.Quota{CPUMillis: 999}}, errdefs.FailedPreconditionKind,
			func(t *testing.T, v View) {
				if v.Quota("t1") != (scheduler.Quota{ConcurrentSandboxes: 10}) {
					t.Fatal("refused quota changed state")
				}
			}},
		{"quota at usage", CmdSetQuota, SetQuotaPayload{Tenant: "t1", Quota: scheduler.Quota{CPUMillis: 1000, ConcurrentSandboxes: 1}}, errdefs.Unknown, nil},
		{"negative quota", CmdSetQuota, SetQuotaPayload{Tenant: "t3", Quota: scheduler.Quota{CPUMillis: -5}}, errdefs.InvalidArgumentKind, nil},
		{"unknown type", CommandType("explode"), struct{}{}, errdefs.InvalidArgumentKind, nil},
		{"bad payload", CmdPlace, "not an object", errdefs.InvalidArgumentKind, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, apply := fsmSetup(t, scheduler.Quota{ConcurrentSandboxes: 10}, 0)
			// Common starting state: host h1 (4 CPUs) with session s1 on it,
			// tenant t2 using its whole quota of one sandbox, and a tiny host h0.
			must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
			must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}))
			must(t, apply(CmdAssignRunner, "", AssignRunnerPayload{SessionID: "s1", NodeID: "n1"}))
			must(t, apply(CmdSetQuota, "", SetQuotaPayload{Tenant: "t2", Quota: scheduler.Quota{ConcurrentSandboxes: 1}}))
			must(t, apply(CmdRegisterHost, "", schedulertest.Host("h0", 1, 1)))
			must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("t2-s", "t2", "h1", 0)}))
			if tt.name == "place same session other host" {
				must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 8192)))
			}
			r := apply(tt.typ, "k", tt.payload)
			if got := errdefs.KindOf(r.Error()); got != tt.kind {
				t.Fatalf("result %+v: kind %v, want %v", r, got, tt.kind)
			}
			if tt.check != nil {
				f.Read(func(v View) { tt.check(t, v) })
			}
		})
	}
}

func must(t *testing.T, r Result) {
	t.Helper()
	if err := r.Error(); err != nil {
		t.Fatal(err)
	}
}

func TestIdempotencyKeys(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 3)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 4000, 8192)))
	first := apply(CmdAssignRunner, "a", AssignRunnerPayload{SessionID: "s", NodeID: "n1"})
	again := apply(CmdAssignRunner, "a", AssignRunnerPayload{SessionID: "s", NodeID: "n1"})
	if first.Replayed || !again.Replayed || !bytes.Equal(first.Value, again.Value) {
		t.Fatalf("first %+v again %+v", first, again)
	}
	f.Read(func(v View) {
		if a, _ := v.Runner("s"); a.Epoch != 1 {
			t.Fatalf("epoch %d after a replayed command, want 1", a.Epoch)
		}
	})
	// A recorded error replays as the same error, even once it would succeed.
	bad := apply(CmdPlace, "p", PlacePayload{Plan: plan("s", "t", "h1", 5000)})
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 8000, 8192)))
	if r := apply(CmdPlace, "p", PlacePayload{Plan: plan("s", "t", "h1", 5000)}); !r.Replayed || errdefs.KindOf(r.Error()) != errdefs.ConflictKind || r.Err.Msg != bad.Err.Msg {
		t.Fatalf("replayed %+v, want the recorded conflict", r)
	}
	// The table is bounded: after 3 newer keys, "a" is forgotten and applies again.
	for i := range 3 {
		apply(CmdAssignRunner, fmt.Sprint("x", i), AssignRunnerPayload{SessionID: "other", NodeID: "n1"})
	}
	if r := apply(CmdAssignRunner, "a", AssignRunnerPayload{SessionID: "s", NodeID: "n1"}); r.Replayed {
		t.Fatal("key beyond the bound was still remembered")
	}
	f.Read(func(v View) {
		if v.RecentKeys() != 3 {
			t.Fatalf("remembering %d keys, bound 3", v.RecentKeys())
		}
	})
}

type memSink struct {
	bytes.Buffer
	canceled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.canceled = true; return nil }
func (s *memSink) Close() error  { return nil }

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{ConcurrentSandboxes: 5}, 0)
	must(t, apply(CmdMember, "m", MemberPayload{ID: "n1", HTTPAddr: "127.0.0.1:9"}))
	must(t, apply(CmdRegisterHost, "h", schedulertest.Host("h1", 4000, 8192)))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 8192)))
	must(t, apply(CmdSetHostStatus, "", HostStatusPayload{ID: "h2", Draining: ptr(true)}))
	must(t, apply(CmdPlace, "p1", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}))
	must(t, apply(CmdPlace, "p2", PlacePayload{Plan: plan("s2", "t1", "h1", 500), SandboxID: "given"}))
	must(t, apply(CmdAssignRunner, "r", AssignRunnerPayload{SessionID: "s1", NodeID: "n1"}))
	must(t, apply(CmdSetQuota, "q", SetQuotaPayload{Tenant: "t9", Quota: scheduler.Quota{MemoryMiB: 7}}))
	if f.Applied() != 8 {
		t.Fatalf("applied index %d after 8 commands", f.Applied())
	}

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil || sink.canceled {
		t.Fatal(err)
	}
	g := NewFSM(scheduler.Quota{ConcurrentSandboxes: 5}, 0)
	if err := g.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	// The restored FSM knows which writes it holds: a reader gated on
	// index 8 must see them without waiting for another command.
	if g.Applied() != 8 {
		t.Fatalf("restored FSM reports applied index %d, want the snapshot's 8", g.Applied())
	}
	dump := func(f *FSM) (s snapshotState, usage map[string]scheduler.Usage, hosts []string) {
		f.Read(func(v View) {
			s, usage = v.f.s, v.f.usage
			for _, h := range v.Hosts() {
				hosts = append(hosts, h.ID)
			}
		})
		return
	}
	s1, u1, h1 := dump(f)
	s2, u2, h2 := dump(g)
	if !reflect.DeepEqual(s1, s2) || !reflect.DeepEqual(u1, u2) || !reflect.DeepEqual(h1, h2) {
		t.Fatalf("restored state differs:\n%+v %v %v\n%+v %v %v", s1, u1, h1, s2, u2, h2)
	}
	if u2["t1"].Sandboxes != 2 || u2["t1"].CPUMillis != 1500 {
		t.Fatalf("derived usage %+v", u2)
	}
	// Recent keys survive: replaying p1 on the restored FSM changes nothing.
	var index uint64 = 100
	c, _ := NewCommand(CmdPlace, "p1", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)})
	b, _ := json.Marshal(c)
	if r := g.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: b}).(*Result); !r.Replayed {
		t.Fatalf("restored FSM forgot key p1: %+v", r)
	}
	if g.Applied() != index {
		t.Fatalf("applied index %d after the log at %d", g.Applied(), index)
	}
	// A log the FSM cannot decode changed nothing, but it was applied:
	// waiters on its index go on.
	if r := g.Apply(&raft.Log{Index: index + 1, Type: raft.LogCommand, Data: []byte("{")}).(*Result); r.Err == nil {
		t.Fatalf("undecodable command applied: %+v", r)
	}
	if g.Applied() != index+1 {
		t.Fatalf("applied index %d after the undecodable log at %d", g.Applied(), index+1)
	}
}

func ptr[T any](v T) *T { return &v }

// A plan that went stale before its commit is planned again inside the FSM
// when it carries its request and config (the same on every replica), and
// refused with a conflict when it does not.
func TestStalePlanIsPlannedAgain(t *testing.T) {
	_, apply := fsmSetup(t, scheduler.Quota{}, 0)
	must(t, apply(CmdRegisterHost, "h1", schedulertest.Host("h1", 1000, 4096)))
	must(t, apply(CmdRegisterHost, "h2", schedulertest.Host("h2", 4000, 4096)))
	must(t, apply(CmdPlace, "p1", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)})) // h1 is now full

	stale := plan("s2", "t1", "h1", 500)
	if r := apply(CmdPlace, "p2", PlacePayload{Plan: stale}); errdefs.KindOf(r.Error()) != errdefs.ConflictKind {
		t.Fatalf("a stale plan without its request: %+v, want a conflict", r)
	}
	req := scheduler.Request{SessionID: "s2", Tenant: "t1", Runtime: "runsc", Resources: stale.Resources}
	cfg := scheduler.DefaultConfig
	var p scheduler.Placement
	if err := apply(CmdPlace, "p3", PlacePayload{Plan: stale, Request: &req, Config: &cfg}).Decode(&p); err != nil || p.HostID != "h2" {
		t.Fatalf("a stale plan with its request: %+v %v, want a placement on h2", p, err)
	}

	// Asking again for a placed session, with a plan for another host,
	// answers the existing placement.
	again := plan("s1", "t1", "h2", 1000)
	req1 := scheduler.Request{SessionID: "s1", Tenant: "t1", Runtime: "runsc", Resources: again.Resources}
	if err := apply(CmdPlace, "p4", PlacePayload{Plan: again, Request: &req1, Config: &cfg}).Decode(&p); err != nil || p.HostID != "h1" {
		t.Fatalf("placing a placed session again: %+v %v, want its placement on h1", p, err)
	}
}
