package server_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
)

// waitPlacement waits, woken by the node's state changes, until the
// session's placement satisfies cond, at most d.
func waitPlacement(t *testing.T, srv *server.Server, sessionID string, d time.Duration, what string, cond func(p scheduler.Placement, v raftfsm.View) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		changed := srv.Raft().Changed()
		ok := false
		srv.Raft().Read(func(v raftfsm.View) {
			if p, found := v.Placement(sessionID); found {
				ok = cond(p, v)
			}
		})
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

// TestIdleSandboxIsPausedAndResumed: a session idle past the interval has
// its gVisor sandbox paused (no host process, its CPU and memory free in
// Raft, the tenant's sandbox counted as paused); the next tool call
// resumes it with the background process of an earlier turn still
// counting from where it was.
func TestIdleSandboxIsPausedAndResumed(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: 300 * time.Millisecond})
	stateDir := t.TempDir()
	d := startGVisorHostWith(t, srv, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: stateDir, Pausable: true})
	s := newToolSession(t, srv)

	// (The fake model's script splits at semicolons: newlines instead.
	// The counter renames each value into place: a reader of a file being
	// rewritten may find it empty.)
	out := toolOutput(t, s.turn(`!tool bash {"command":"sh -c 'i=0\nwhile :\ndo i=$((i+1))\necho $i > n.new\nmv n.new n\nsleep 0.1\ndone' >/dev/null 2>&1 &\necho $! > bg.pid\necho started"}`))
	if !strings.Contains(out, "started") {
		t.Fatalf("first turn: %q", out)
	}
	waitPlacement(t, srv, s.id, time.Minute, "the idle session's sandbox to be paused", func(p scheduler.Placement, v raftfsm.View) bool {
		return p.Paused()
	})
	var paused scheduler.Placement
	srv.Raft().Read(func(v raftfsm.View) {
		paused, _ = v.Placement(s.id)
		h, _ := v.Host(paused.HostID)
		u := v.Usage(string(tenant.Default))
		// Of its disk it holds what the host measured: its checkpoint and
		// the disk image's blocks, far less than its request.
		if h.Allocated.CPUMillis != 0 || h.Allocated.MemoryMiB != 0 || h.Allocated.DiskMiB != paused.PausedDiskMiB ||
			paused.PausedDiskMiB <= 0 || paused.PausedDiskMiB >= paused.Resources.DiskMiB || u.Sandboxes != 0 || u.PausedSandboxes != 1 {
			t.Errorf("paused: host allocated %+v (placement %+v, holding %d MiB of disk), tenant usage %+v", h.Allocated, paused.Resources, paused.PausedDiskMiB, u)
		}
	})
	refs, err := d.List(context.Background())
	if err != nil || len(refs) != 1 || !refs[0].Paused {
		t.Fatalf("the host's sandboxes while paused: %+v, %v", refs, err)
	}
	id := refs[0].ID
	if image := allocatedUnder(t, filepath.Join(stateDir, id, "checkpoint")); paused.PausedDiskMiB<<20 < image {
		t.Errorf("the paused placement holds %d MiB of disk, less than its checkpoint image's %d bytes", paused.PausedDiskMiB, image)
	}
	if n := hostProcesses(t, id); n != 0 {
		t.Errorf("%d host processes of the paused sandbox %s still run", n, id)
	}
	b, err := os.ReadFile(filepath.Join(stateDir, id, "workspace", "n"))
	if err != nil {
		t.Fatal(err)
	}
	atPause, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if atPause < 1 {
		t.Fatalf("the counter had not started before the pause: %q", b)
	}

	out = toolOutput(t, s.turn(`!tool bash {"command":"kill -0 $(cat bg.pid) && echo alive\na=$(cat n)\nsleep 0.5\necho counter $a $(cat n)"}`))
	var alive bool
	var a, c int
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) == "alive" {
			alive = true
		}
		if f := strings.Fields(line); len(f) == 3 && f[0] == "counter" {
			a, _ = strconv.Atoi(f[1])
			c, _ = strconv.Atoi(f[2])
		}
	}
	if !alive || a < atPause || c <= a {
		t.Fatalf("after resume: %q (counter was %d when paused)", out, atPause)
	}
	srv.Raft().Read(func(v raftfsm.View) {
		p, _ := v.Placement(s.id)
		h, _ := v.Host(p.HostID)
		if u := v.Usage(string(tenant.Default)); u.Sandboxes != 1 || u.PausedSandboxes != 0 || h.Allocated != p.Resources || p.PausedDiskMiB != 0 {
			t.Errorf("resumed: placement %+v, host allocated %+v, tenant usage %+v", p, h.Allocated, u)
		}
	})
	t.Logf("counter %d when paused, %d then %d after resume; %d MiB of disk held while paused (of %d requested)", atPause, a, c, paused.PausedDiskMiB, paused.Resources.DiskMiB)
}

// hostProcesses counts the host processes whose command line names id.
func hostProcesses(t *testing.T, id string) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		if cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline")); err == nil && strings.Contains(string(cmd), id) {
			n++
		}
	}
	return n
}

// allocatedUnder is the bytes allocated to the files beneath dir.
func allocatedUnder(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := e.Info(); err == nil {
			n += info.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
