package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// providerHost is a gVisor host agent whose provider's canary runs a
// runsc the test can break, on a ticker the test drives.
type providerHost struct {
	id    string
	runsc string         // the canary's runsc: a script over the real one
	tick  chan time.Time // the canary loop's ticker
}

// break makes the host's canary runsc fail, and runs the canary.
func (h *providerHost) setBroken(t *testing.T, broken bool) {
	t.Helper()
	script := "#!/bin/sh\nexec " + containerd.DefaultRunscPath + " \"$@\"\n"
	if broken {
		script = "#!/bin/sh\necho 'runsc: broken by the test' >&2\nexit 1\n"
	}
	if err := os.WriteFile(h.runsc+".new", []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(h.runsc+".new", h.runsc); err != nil {
		t.Fatal(err)
	}
	h.tick <- time.Now()
}

func startProviderHost(t *testing.T, srv *server.Server, id string) *providerHost {
	t.Helper()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	h := &providerHost{id: id, runsc: filepath.Join(t.TempDir(), "runsc"), tick: make(chan time.Time)}
	if err := os.WriteFile(h.runsc, []byte("#!/bin/sh\nexec "+containerd.DefaultRunscPath+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := agent.NewProvider("gvisor", agent.ProviderConfig{Driver: d, Binary: h.runsc, CanaryImage: server.DefaultSandboxImage})
	if err != nil {
		t.Fatal(err)
	}
	joinAgent(t, srv, agent.Config{
		HostID: id, Driver: d, Runtime: containerd.RuntimeGVisor, Providers: []agent.Provider{p},
		NewCanaryTicker: func(time.Duration) (<-chan time.Time, func()) { return h.tick, func() {} },
	})
	return h
}

// fsmHost is (a copy of) a host as this node's FSM has it.
func fsmHost(srv *server.Server, id string) *scheduler.Host {
	h := &scheduler.Host{}
	srv.Raft().Read(func(v raftfsm.View) {
		if p, ok := v.Host(id); ok {
			*h = *p
		}
	})
	return h
}

func listHost(t *testing.T, admin adminv1.HostsServiceClient, id string) *adminv1.Host {
	t.Helper()
	resp, err := admin.ListHosts(context.Background(), &adminv1.ListHostsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.GetHosts() {
		if h.GetId() == id {
			return h
		}
	}
	t.Fatalf("ListHosts has no host %s", id)
	return nil
}

// TestBrokenProviderTakesNoNewPlacements: two gVisor hosts; the gVisor
// provider of one fails its canary (its runsc exits 1). New sessions land
// on the other, ListHosts says why; fixed, it takes placements again
// (shown by breaking the other), and a session already on a host whose
// provider broke keeps running there.
func TestBrokenProviderTakesNoNewPlacements(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor})
	a, b := startProviderHost(t, srv, "prov-a"), startProviderHost(t, srv, "prov-b")
	admin := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))

	reg := listHost(t, admin, "prov-a")
	if len(reg.GetProviderDetails()) != 1 {
		t.Fatalf("registered providers %v", reg.GetProviderDetails())
	}
	if p := reg.GetProviderDetails()[0]; p.GetName() != "gvisor" || p.GetIsolation() != "user_kernel" || p.GetPlatform() != "systrap" || !p.GetHealthy() || !reg.GetSchedulable() {
		t.Fatalf("host prov-a as registered: %v", reg)
	}

	a.setBroken(t, true)
	waitfor.Cond(t, 30*time.Second, "prov-a's gvisor provider to be recorded failing", func() bool {
		o, _ := fsmHost(srv, "prov-a").Offer("gvisor")
		return !o.Healthy
	})
	got := listHost(t, admin, "prov-a")
	p := got.GetProviderDetails()[0]
	if got.GetSchedulable() || p.GetHealthy() || !strings.Contains(p.GetReason(), "broken by the test") || p.GetSince() == nil ||
		len(got.GetUnschedulableReasons()) != 1 || !strings.Contains(got.GetUnschedulableReasons()[0], "provider gvisor: canary") {
		t.Fatalf("ListHosts for the broken host: %v", got)
	}
	t.Logf("ListHosts says: %q", got.GetUnschedulableReasons())

	var onB []*session
	for range 3 {
		s := newToolSession(t, srv)
		if out := s.bash("echo placed"); !strings.Contains(out, "placed") {
			t.Fatalf("tool call with one provider broken: %q", out)
		}
		if host, _, _ := placement(srv, s.id); host != "prov-b" {
			t.Fatalf("a new session was placed on %q while prov-a's provider fails its canary", host)
		}
		onB = append(onB, s)
	}

	// Fixed: prov-a takes placements again. Breaking prov-b shows it.
	a.setBroken(t, false)
	waitfor.Cond(t, 30*time.Second, "prov-a's gvisor provider to be recorded healthy", func() bool {
		o, _ := fsmHost(srv, "prov-a").Offer("gvisor")
		return o.Healthy
	})
	if got := listHost(t, admin, "prov-a"); !got.GetSchedulable() || !got.GetProviderDetails()[0].GetHealthy() {
		t.Fatalf("ListHosts for the fixed host: %v", got)
	}
	b.setBroken(t, true)
	waitfor.Cond(t, 30*time.Second, "prov-b's gvisor provider to be recorded failing", func() bool {
		o, _ := fsmHost(srv, "prov-b").Offer("gvisor")
		return !o.Healthy
	})
	s := newToolSession(t, srv)
	s.bash("true")
	if host, _, _ := placement(srv, s.id); host != "prov-a" {
		t.Fatalf("after prov-a was fixed and prov-b broke, a new session was placed on %q", host)
	}
	// Existing placements stay: the sessions on prov-b keep running there.
	if out := onB[0].bash("echo still here"); !strings.Contains(out, "still here") {
		t.Fatalf("a session on the host whose provider broke: %q", out)
	}
	if host, _, _ := placement(srv, onB[0].id); host != "prov-b" {
		t.Fatalf("the session on prov-b moved to %q", host)
	}
}

// TestHostHealthStopsPlacements: memory pressure, disk pressure and an
// unreachable containerd each keep new placements off a host (process
// hosts, whose checks the test sets), with the reason in ListHosts; the
// recovered host takes them again. Health reaches Raft only when it
// changes, not with every heartbeat.
func TestHostHealthStopsPlacements(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", HostHeartbeatInterval: 50 * time.Millisecond})
	var mem, disk, containerdDown atomic.Bool
	startHostWith(t, srv, "sick", func(c *agent.Config) {
		c.Pressure = func(context.Context) (agent.Pressure, error) {
			return agent.Pressure{Memory: mem.Load(), Disk: disk.Load()}, nil
		}
		c.Checks = []agent.Check{{Type: "containerd_reachable", Run: func(context.Context) error {
			if containerdDown.Load() {
				return errors.New("connection refused")
			}
			return nil
		}}}
	})
	admin := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	healthy := func() bool { return fsmHost(srv, "sick").Healthy() && len(fsmHost(srv, "sick").Conditions) == 3 }
	waitfor.Cond(t, 30*time.Second, "the host's first conditions", healthy)
	for _, tc := range []struct {
		cond string
		set  *atomic.Bool
		why  string
	}{
		{"memory_pressure", &mem, "under pressure"},
		{"disk_pressure", &disk, "under pressure"},
		{"containerd_reachable", &containerdDown, "connection refused"},
	} {
		tc.set.Store(true)
		// This condition failing, not only the host unhealthy: the one
		// before is still failing.
		waitfor.Cond(t, 30*time.Second, tc.cond+" to be recorded", func() bool {
			c, ok := fsmHost(srv, "sick").Condition(tc.cond)
			return ok && !c.OK && !fsmHost(srv, "sick").Healthy()
		})
		got := listHost(t, admin, "sick")
		var c *adminv1.HostCondition
		for _, x := range got.GetConditions() {
			if x.GetType() == tc.cond {
				c = x
			}
		}
		if got.GetSchedulable() || c == nil || c.GetOk() || !strings.Contains(c.GetReason(), tc.why) || c.GetSince() == nil {
			t.Fatalf("%s: ListHosts has %v", tc.cond, got)
		}
		// A steady condition is written once: heartbeats go on (each
		// with a new check time), the record keeps the time of the change.
		recorded, _ := fsmHost(srv, "sick").Condition(tc.cond)
		n := srv.Hosts().Heartbeats()
		waitfor.Cond(t, 30*time.Second, "five more heartbeats", func() bool { return srv.Hosts().Heartbeats() >= n+5 })
		if now, _ := fsmHost(srv, "sick").Condition(tc.cond); !now.Since.Equal(recorded.Since) || now.Since.IsZero() {
			t.Errorf("%s: recorded since %v, after 5 heartbeats of unchanged health %v: written again", tc.cond, recorded.Since, now.Since)
		}
		s := newToolSession(t, srv)
		evs := s.turn(`!tool bash {"command":"echo hi"}`)
		if _, _, ok := placement(srv, s.id); ok {
			t.Fatalf("%s: a session was placed on the only host, which is unhealthy (%v)", tc.cond, evs)
		}
		tc.set.Store(false)
		waitfor.Cond(t, 30*time.Second, tc.cond+" to recover", healthy)
		s = newToolSession(t, srv)
		if out := s.bash("echo back"); !strings.Contains(out, "back") {
			t.Fatalf("%s recovered: tool call %q", tc.cond, out)
		}
		if host, _, _ := placement(srv, s.id); host != "sick" {
			t.Fatalf("%s recovered: placed on %q", tc.cond, host)
		}
	}
}
