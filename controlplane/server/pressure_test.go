package server_test

import (
	"context"
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
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// startPressureHost joins a gVisor host agent with pausable sandboxes to
// srv, under memory pressure while pressure is set and one of its
// sandboxes runs unpaused.
func startPressureHost(t *testing.T, srv *server.Server, pressure *atomic.Bool) *containerd.Driver {
	t.Helper()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir(), Pausable: true})
	joinAgent(t, srv, agent.Config{
		HostID: "pressure", Driver: d, Runtime: containerd.RuntimeGVisor,
		Pressure: func(ctx context.Context) (agent.Pressure, error) {
			if !pressure.Load() {
				return agent.Pressure{}, nil
			}
			refs, err := d.List(ctx)
			on := false
			for _, r := range refs {
				on = on || !r.Paused
			}
			return agent.Pressure{Memory: on}, err
		},
	})
	return d
}

// TestMemoryPressurePausesBeforeEvicting: a host under memory pressure
// pauses the idle sandbox of a session (it evicts nothing); the control
// plane records the placement paused (CPU and memory free, the tenant's
// sandbox counted as paused), and the session's next tool call resumes it
// through the control plane with its files and background process intact.
func TestMemoryPressurePausesBeforeEvicting(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor,
		HostHeartbeatInterval: 200 * time.Millisecond, HostTTL: time.Minute})
	var pressure atomic.Bool
	d := startPressureHost(t, srv, &pressure)
	s := newToolSession(t, srv)
	out := toolOutput(t, s.turn(`!tool bash {"command":"sleep 1000 >/dev/null 2>&1 &\necho $! > bg.pid\necho kept > f.txt\necho started"}`))
	if !strings.Contains(out, "started") {
		t.Fatalf("first turn: %q", out)
	}

	pressure.Store(true)
	waitPlacement(t, srv, s.id, time.Minute, "the placement of the sandbox paused under pressure to be paused", func(p scheduler.Placement, v raftfsm.View) bool {
		return p.Paused()
	})
	pressure.Store(false)
	srv.Raft().Read(func(v raftfsm.View) {
		p, _ := v.Placement(s.id)
		h, _ := v.Host(p.HostID)
		u := v.Usage(string(tenant.Default))
		// Of its disk it holds what its host measured at the pause.
		if !p.Ready || h.Allocated.CPUMillis != 0 || h.Allocated.MemoryMiB != 0 || u.Sandboxes != 0 || u.PausedSandboxes != 1 ||
			p.PausedDiskMiB <= 0 || h.Allocated.DiskMiB != p.PausedDiskMiB {
			t.Errorf("paused under pressure: placement %+v, host allocated %+v, tenant usage %+v", p, h.Allocated, u)
		}
	})
	refs, err := d.List(context.Background())
	if err != nil || len(refs) != 1 || !refs[0].Paused {
		t.Fatalf("the host's sandboxes: %+v, %v; want the one, paused (not evicted)", refs, err)
	}

	out = toolOutput(t, s.turn(`!tool bash {"command":"kill -0 $(cat bg.pid) && echo alive\ncat f.txt"}`))
	if !strings.Contains(out, "alive") || !strings.Contains(out, "kept") {
		t.Fatalf("after the resume: %q", out)
	}
	srv.Raft().Read(func(v raftfsm.View) {
		p, _ := v.Placement(s.id)
		if u := v.Usage(string(tenant.Default)); p.Paused() || u.Sandboxes != 1 || u.PausedSandboxes != 0 {
			t.Errorf("resumed: placement %+v, tenant usage %+v", p, u)
		}
	})
}
