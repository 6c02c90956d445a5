package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
)

// waitReleased waits, woken by the node's state changes, until the session
// has no placement, at most d.
func waitReleased(t *testing.T, srv *server.Server, sessionID string, d time.Duration, what string) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		changed := srv.Raft().Changed()
		found := false
		srv.Raft().Read(func(v raftfsm.View) { _, found = v.Placement(sessionID) })
		if !found {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

// archive archives the session through the public API.
func (s *session) archive() {
	s.t.Helper()
	got := postJSON(s.t, s.c, s.base+"/v1/sessions/"+s.id+"/archive", nil)
	if got["archived_at"] == nil {
		s.t.Fatalf("archived session: %v", got)
	}
}

// usage is the default tenant's sandbox usage in Raft.
func usage(srv *server.Server) (u scheduler.Usage) {
	srv.Raft().Read(func(v raftfsm.View) { u = v.Usage(string(tenant.Default)) })
	return u
}

// TestArchivedSessionIsPausedThenReleased: archiving a session pauses its
// gVisor sandbox at once (the tenant's sandbox counts as paused), and the
// retention later releases it: the placement is gone, the tenant's usage
// is zero and the host destroys the sandbox. The archived session accepts
// no more events.
func TestArchivedSessionIsPausedThenReleased(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	const retention = 4 * time.Second
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor,
		ArchiveReleaseAfter: retention, SweepInterval: 100 * time.Millisecond})
	d := startGVisorHostWith(t, srv, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir(), Pausable: true})
	s := newToolSession(t, srv)
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo ready"}`)); !strings.Contains(out, "ready") {
		t.Fatalf("first turn: %q", out)
	}
	if u := usage(srv); u.Sandboxes != 1 || u.PausedSandboxes != 0 {
		t.Fatalf("before the archive, tenant usage %+v", u)
	}

	start := time.Now()
	s.archive()
	waitPlacement(t, srv, s.id, time.Minute, "the archived session's sandbox to be paused", func(p scheduler.Placement, v raftfsm.View) bool {
		return p.Paused()
	})
	paused := time.Since(start)
	if u := usage(srv); u.Sandboxes != 0 || u.PausedSandboxes != 1 || u.CPUMillis != 0 || u.MemoryMiB != 0 {
		t.Errorf("archived and paused: tenant usage %+v", u)
	}
	refs, err := d.List(context.Background())
	if err != nil || len(refs) != 1 || !refs[0].Paused {
		t.Fatalf("the host's sandboxes while archived: %+v, %v", refs, err)
	}
	resp, err := s.c.Post(s.base+"/v1/sessions/"+s.id+"/events?beta=true", "application/json",
		strings.NewReader(`{"events":[{"type":"user.message","content":[{"type":"text","text":"hello"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("an event for the archived session: %d, want 409", resp.StatusCode)
	}

	waitReleased(t, srv, s.id, time.Minute, "the archived session's sandbox to be released")
	released := time.Since(start)
	// The sweep judges by archived_at, which the archive set before it
	// answered.
	if released < retention-time.Second {
		t.Errorf("released %v after the archive, before the retention of %v", released, retention)
	}
	if u := usage(srv); u != (scheduler.Usage{}) {
		t.Errorf("released: tenant usage %+v, want none", u)
	}
	waitfor.Cond(t, time.Minute, "the host to destroy the released sandbox", func() bool {
		refs, err := d.List(context.Background())
		return err == nil && len(refs) == 0
	})
	t.Logf("archived: paused after %v, released after %v (retention %v)", paused, released, retention)
}

// TestArchivedSessionReleasedAtOnce: with a retention of zero an archived
// session's sandbox is released at once, whatever its runtime.
func TestArchivedSessionReleasedAtOnce(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeProcess,
		ArchiveReleaseAfter: -1, SweepInterval: time.Hour})
	d, _ := startHost(t, srv, "h1")
	s := newToolSession(t, srv)
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo ready"}`)); !strings.Contains(out, "ready") {
		t.Fatalf("first turn: %q", out)
	}
	start := time.Now()
	s.archive()
	// The sweep runs hourly here: the archive itself released it.
	waitReleased(t, srv, s.id, 30*time.Second, "the archived session's sandbox to be released at once")
	if u := usage(srv); u != (scheduler.Usage{}) {
		t.Errorf("released: tenant usage %+v, want none", u)
	}
	waitfor.Cond(t, 30*time.Second, "the host to destroy the released sandbox", func() bool {
		refs, err := d.List(context.Background())
		return err == nil && len(refs) == 0
	})
	t.Logf("released %v after the archive", time.Since(start))
}
