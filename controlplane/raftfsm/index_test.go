package raftfsm

import (
	"io"
	"slices"
	"testing"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
)

// candidates is the ids of the FSM index's candidates for pools and a
// provider, and of the same from an index built afresh from the FSM's
// hosts: the two must agree after every command.
func candidates(t *testing.T, f *FSM, pools []string, provider string) []string {
	t.Helper()
	var kept, fresh []string
	f.Read(func(v View) {
		for _, l := range v.Index().Candidates(pools, provider) {
			for _, h := range l {
				kept = append(kept, h.ID)
			}
		}
		for _, l := range scheduler.NewIndex(v.Hosts()...).Candidates(pools, provider) {
			for _, h := range l {
				fresh = append(fresh, h.ID)
			}
		}
	})
	if !slices.Equal(kept, fresh) {
		t.Fatalf("the FSM's index holds %v for %v/%q, an index built afresh %v", kept, pools, provider, fresh)
	}
	return kept
}

// The FSM keeps its index with every command that changes a host:
// registration (and a new registration with other labels or providers),
// status, cordon and drain, health; and a restored FSM rebuilds it.
func TestFSMIndexFollowsHosts(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{}, 0)
	host := func(id, pool string, providers ...string) scheduler.Host {
		h := schedulertest.Host(id, 4000, 8192)
		h.Labels = map[string]string{scheduler.PoolLabel: pool}
		h.Providers = providers
		return h
	}
	want := func(step string, pools []string, provider string, ids ...string) {
		t.Helper()
		if got := candidates(t, f, pools, provider); !slices.Equal(got, ids) {
			t.Fatalf("%s: candidates of %v/%q = %v, want %v", step, pools, provider, got, ids)
		}
	}
	must(t, apply(CmdRegisterHost, "", host("a", "p1", "gvisor")))
	must(t, apply(CmdRegisterHost, "", host("b", "p1", "runc")))
	must(t, apply(CmdRegisterHost, "", host("c", "p2", "gvisor")))
	want("registered", []string{"p1"}, "gvisor", "a")
	want("registered", nil, "gvisor", "a", "c")
	want("registered", []string{"p1", "p2"}, "runsc", "a", "b", "c")

	// Registering again with another pool and providers re-files the host.
	must(t, apply(CmdRegisterHost, "", host("b", "p2", "gvisor")))
	want("relabelled", []string{"p1"}, "", "a")
	want("relabelled", []string{"p2"}, "gvisor", "b", "c")
	want("relabelled", nil, "runc")

	// Status, cordon, drain and health take a host out; their reverse
	// puts it back.
	for _, step := range []struct {
		name      string
		out, back any
	}{
		{"down", HostStatusPayload{ID: "c", Status: ptr(scheduler.StatusDown)}, HostStatusPayload{ID: "c", Status: ptr(scheduler.StatusReady)}},
		{"cordoned", HostStatusPayload{ID: "c", Eligible: ptr(false)}, HostStatusPayload{ID: "c", Eligible: ptr(true)}},
		{"draining", HostStatusPayload{ID: "c", Draining: ptr(true)}, HostStatusPayload{ID: "c", Draining: ptr(false)}},
		{"memory pressure",
			HostHealthPayload{HostID: "c", Conditions: []scheduler.Condition{{Type: "memory_pressure", Reason: "2% available"}}},
			HostHealthPayload{HostID: "c", Conditions: []scheduler.Condition{{Type: "memory_pressure", OK: true}}}},
	} {
		typ := CmdSetHostStatus
		if _, ok := step.out.(HostHealthPayload); ok {
			typ = CmdSetHostHealth
		}
		must(t, apply(typ, "", step.out))
		want(step.name, []string{"p2"}, "gvisor", "b")
		must(t, apply(typ, "", step.back))
		want(step.name+", back", []string{"p2"}, "gvisor", "b", "c")
	}

	// Zone spread's counts follow placements, moves, releases and a
	// host's new zone.
	zoned := func(id, zone string) scheduler.Host {
		h := host(id, "p2", "gvisor")
		h.Labels[scheduler.ZoneLabel] = zone
		return h
	}
	must(t, apply(CmdRegisterHost, "", zoned("b", "za")))
	must(t, apply(CmdRegisterHost, "", zoned("c", "zb")))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s1", "t1", "b", 100)}))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s2", "t1", "b", 100)}))
	must(t, apply(CmdPlace, "", PlacePayload{Plan: plan("s3", "t2", "c", 100)}))
	zoneCounts(t, f, "placed", map[string]int{"za/t1": 2, "zb/t2": 1})
	must(t, apply(CmdMovePlacement, "", MovePayload{SessionID: "s2", From: "b", Plan: plan("s2", "t1", "c", 100)}))
	zoneCounts(t, f, "moved", map[string]int{"za/t1": 1, "zb/t1": 1, "zb/t2": 1})
	must(t, apply(CmdRegisterHost, "", zoned("c", "za")))
	zoneCounts(t, f, "rezoned", map[string]int{"za/t1": 2, "za/t2": 1})
	must(t, apply(CmdRelease, "", ReleasePayload{SessionID: "s1"}))
	zoneCounts(t, f, "released", map[string]int{"za/t1": 1, "za/t2": 1})

	// A restored FSM rebuilds the index from the snapshot's hosts.
	must(t, apply(CmdSetHostStatus, "", HostStatusPayload{ID: "a", Draining: ptr(true)}))
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
	f = g
	want("restored", nil, "gvisor", "b", "c")
	want("restored", []string{"p1"}, "")
	zoneCounts(t, f, "restored", map[string]int{"za/t1": 1, "za/t2": 1})
}

// zoneCounts checks the index's count of each tenant's sandboxes by zone
// ("zone/tenant") against want, and against the placements themselves.
func zoneCounts(t *testing.T, f *FSM, step string, want map[string]int) {
	t.Helper()
	f.Read(func(v View) {
		counted := map[string]int{}
		for _, p := range v.Placements() {
			h, _ := v.Host(p.HostID)
			counted[h.Labels[scheduler.ZoneLabel]+"/"+p.Tenant]++
		}
		for _, zone := range []string{"", "za", "zb"} {
			for _, tenant := range []string{"t1", "t2"} {
				k := zone + "/" + tenant
				if got := v.Index().ZoneSandboxes(zone, tenant); got != want[k] || got != counted[k] {
					t.Errorf("%s: the index counts %d sandboxes for %s, the placements %d, want %d", step, got, k, counted[k], want[k])
				}
			}
		}
	})
}
