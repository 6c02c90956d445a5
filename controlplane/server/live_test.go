package server_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// startGVisorHostAs starts a host agent id over a gVisor driver of cfg
// (its own state dir unless cfg names one) and waits until it is
// connected. capacity zero: room for many sandboxes.
func startGVisorHostAs(tb testing.TB, srv *server.Server, id string, cfg containerd.Config, capacity agent.Resources) *containerd.Driver {
	tb.Helper()
	return startGVisorHostEgress(tb, srv, id, cfg, capacity, agent.EgressConfig{})
}

// startGVisorHostEgress is startGVisorHostAs with the host's egress policy.
func startGVisorHostEgress(tb testing.TB, srv *server.Server, id string, cfg containerd.Config, capacity agent.Resources, eg agent.EgressConfig) *containerd.Driver {
	tb.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	d := containerdtest.NewDriver(tb, cfg)
	if capacity == (agent.Resources{}) {
		capacity = agent.Resources{CPUMillis: 64000, MemoryBytes: 256 << 30, DiskBytes: 1 << 40}
	}
	joinAgent(tb, srv, agent.Config{
		HostID: id, Driver: d, Runtime: containerd.RuntimeGVisor, Capacity: capacity, Egress: eg,
	})
	return d
}

// drainHost drains a host through the admin API and returns its last
// progress message and every message's text.
func drainHost(tb testing.TB, srv *server.Server, key, hostID string, deadline time.Duration) (*adminv1.DrainHostResponse, []string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline+time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	t, _ := tb.(*testing.T)
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	stream, err := adminv1.NewHostsServiceClient(conn).DrainHost(ctx, &adminv1.DrainHostRequest{HostId: hostID, Deadline: durationpb.New(deadline)})
	if err != nil {
		tb.Fatal(err)
	}
	var last, prev *adminv1.DrainHostResponse
	var msgs []string
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatalf("drain: %v", err)
		}
		if t != nil {
			t.Logf("drain progress: moved %d (%d live), evicted %d, remaining %d: %s", m.GetMoved(), m.GetMovedLive(), m.GetEvicted(), m.GetRemaining(), m.GetMessage())
		}
		if !m.GetDone() {
			prev = m
		}
		last = m
		msgs = append(msgs, m.GetMessage())
	}
	if last == nil || !last.GetDone() {
		tb.Fatalf("the drain did not finish: %v", last)
	}
	return prev, msgs
}

// counterCommand starts a background counter in the workspace (renaming
// each value into place: a reader of a file being rewritten may find it
// empty); the fake model's script splits at semicolons, so newlines.
const counterCommand = `!tool bash {"command":"sh -c 'i=0\nwhile :\ndo i=$((i+1))\necho $i > n.new\nmv n.new n\nsleep 0.1\ndone' >/dev/null 2>&1 &\necho $! > bg.pid\necho started"}`

// checkCommand reports whether the counter's process lives and two
// readings of its counter half a second apart.
const checkCommand = `!tool bash {"command":"kill -0 $(cat bg.pid) 2>/dev/null && echo alive\na=$(cat n)\nsleep 0.5\necho counter $a $(cat n)"}`

// parseCheck reads checkCommand's output.
func parseCheck(out string) (alive bool, a, c int) {
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) == "alive" {
			alive = true
		}
		if f := strings.Fields(line); len(f) == 3 && f[0] == "counter" {
			a, _ = strconv.Atoi(f[1])
			c, _ = strconv.Atoi(f[2])
		}
	}
	return alive, a, c
}

// readCounter reads the counter's value on the host, from the sandbox's
// workspace in a driver's state dir (0 before its first value).
func readCounter(t *testing.T, d *containerd.Driver) int {
	t.Helper()
	refs, err := d.List(context.Background())
	if err != nil || len(refs) != 1 {
		t.Fatalf("the host's sandboxes: %+v, %v", refs, err)
	}
	sb, err := d.Attach(context.Background(), refs[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := sb.ReadFile(context.Background(), "n", 0)
	if errdefs.IsNotFound(err) || errors.Is(err, fs.ErrNotExist) {
		return 0 // not written yet
	}
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// rescheduledEvents returns the session's session.status_rescheduled
// events' "moved" fields.
func movedEvents(s *session) []string {
	var out []string
	for _, e := range s.events() {
		if e["type"] == server.RescheduledEvent && e["reason"] == "host_drained" {
			m, _ := e["moved"].(string)
			out = append(out, m)
		}
	}
	return out
}

// TestDrainMovesSandboxLive: between two pausable gVisor host agents, a
// drain moves a session's sandbox live. The next turn runs on the other
// host, the background process an earlier turn started is alive there and
// its counter went on from where it was, and the session was told it
// moved live (in the tool result and in its event log).
func TestDrainMovesSandboxLive(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: -1})
	ds := map[string]*containerd.Driver{
		"live-a": startGVisorHostAs(t, srv, "live-a", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{}),
		"live-b": startGVisorHostAs(t, srv, "live-b", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{}),
	}
	srv.Raft().Read(func(v raftfsm.View) {
		for id := range ds {
			if h, ok := v.Host(id); !ok || !h.Pausable {
				t.Errorf("host %s is not recorded pausable: %+v", id, h)
			}
		}
	})
	s := newToolSession(t, srv)
	if out := toolOutput(t, s.turn(counterCommand)); !strings.Contains(out, "started") {
		t.Fatalf("first turn: %q", out)
	}
	from, _, _ := placement(srv, s.id)
	to := map[string]string{"live-a": "live-b", "live-b": "live-a"}[from]
	waitfor.Cond(t, 30*time.Second, "the counter to count", func() bool { return readCounter(t, ds[from]) >= 3 })

	last, msgs := drainHost(t, srv, servertest.OperatorKey(t, db), from, time.Minute)
	if last.GetMoved() != 1 || last.GetMovedLive() != 1 || last.GetEvicted() != 0 || !strings.Contains(strings.Join(msgs, "\n"), string(fleet.DrainMovedLive)+" to "+to) {
		t.Fatalf("drain: last progress %v, messages %q", last, msgs)
	}
	if host, _, _ := placement(srv, s.id); host != to {
		t.Fatalf("after the drain the session is on %q, want %s", host, to)
	}
	atMove := readCounter(t, ds[to])

	out := toolOutput(t, s.turn(checkCommand))
	alive, a, c := parseCheck(out)
	if !alive || a < atMove || c <= a {
		t.Fatalf("after the live move: %q (the counter was %d on arrival)", out, atMove)
	}
	if !strings.HasPrefix(out, fleet.MovedNotice[scheduler.MovedLive]) {
		t.Errorf("the first tool result after the move does not say it moved live: %q", out)
	}
	if got := movedEvents(s); len(got) != 1 || got[0] != scheduler.MovedLive {
		t.Errorf("drain events in the session's log: %q, want one %q", got, scheduler.MovedLive)
	}
	if out := toolOutput(t, s.turn(`!tool bash {"command":"echo again"}`)); strings.Contains(out, "Note:") {
		t.Errorf("the notice came twice: %q", out)
	}
	waitfor.Cond(t, 30*time.Second, "the drained host to destroy its sandbox", func() bool {
		refs, err := ds[from].List(context.Background())
		return err == nil && len(refs) == 0
	})
	t.Logf("counter %d on arrival, %d then %d in the next turn", atMove, a, c)
}

// TestDrainFallsBackToWorkspaceMove: when the only other host is not
// pausable, the drain moves the sandbox with its workspace: its files are
// there, its background process is not, and the session is told so.
func TestDrainFallsBackToWorkspaceMove(t *testing.T) {
	containerdtest.Address(t)
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: -1})
	da := startGVisorHostAs(t, srv, "ws-a", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{})
	s := newToolSession(t, srv)
	if out := toolOutput(t, s.turn(counterCommand)); !strings.Contains(out, "started") {
		t.Fatalf("first turn: %q", out)
	}
	waitfor.Cond(t, 30*time.Second, "the counter to count", func() bool { return readCounter(t, da) >= 3 })
	startGVisorHostAs(t, srv, "ws-b", containerd.Config{Runtime: containerd.RuntimeGVisor}, agent.Resources{})

	last, msgs := drainHost(t, srv, servertest.OperatorKey(t, db), "ws-a", time.Minute)
	if last.GetMoved() != 1 || last.GetMovedLive() != 0 || !strings.Contains(strings.Join(msgs, "\n"), string(fleet.DrainMoved)+" to ws-b") {
		t.Fatalf("drain: last progress %v, messages %q", last, msgs)
	}
	out := toolOutput(t, s.turn(checkCommand))
	// (Not kill -0 of its pid: the new sandbox's own processes may have
	// that number.)
	_, a, c := parseCheck(out)
	if a < 3 || c != a {
		t.Errorf("after a workspace move: the counter's file is gone (%d) or it still counts (%d): %q", a, c, out)
	}
	if !strings.HasPrefix(out, fleet.MovedNotice[scheduler.MovedWorkspace]) {
		t.Errorf("the first tool result after the move does not say it moved with its workspace: %q", out)
	}
	if got := movedEvents(s); len(got) != 1 || got[0] != scheduler.MovedWorkspace {
		t.Errorf("drain events in the session's log: %q, want one %q", got, scheduler.MovedWorkspace)
	}
}

// TestDrainMovesPausedSandboxLive: a sandbox paused while idle moves live
// with a drain (its checkpoint is already taken) and runs on its new host:
// the background counter of its first turn goes on from where the pause
// stopped it.
func TestDrainMovesPausedSandboxLive(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: 300 * time.Millisecond})
	ds := map[string]*containerd.Driver{
		"paused-a": startGVisorHostAs(t, srv, "paused-a", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{}),
		"paused-b": startGVisorHostAs(t, srv, "paused-b", containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true}, agent.Resources{}),
	}
	s := newToolSession(t, srv)
	if out := toolOutput(t, s.turn(counterCommand)); !strings.Contains(out, "started") {
		t.Fatalf("first turn: %q", out)
	}
	waitPlacement(t, srv, s.id, time.Minute, "the idle session's sandbox to be paused", func(p scheduler.Placement, v raftfsm.View) bool {
		return p.Paused()
	})
	from, _, _ := placement(srv, s.id)
	to := map[string]string{"paused-a": "paused-b", "paused-b": "paused-a"}[from]
	atPause := readCounter(t, ds[from])
	if atPause < 1 {
		t.Fatalf("the counter had not started before the pause: %d", atPause)
	}
	last, msgs := drainHost(t, srv, servertest.OperatorKey(t, db), from, time.Minute)
	if last.GetMovedLive() != 1 || last.GetEvicted() != 0 {
		t.Fatalf("drain: last progress %v, messages %q", last, msgs)
	}
	if host, _, _ := placement(srv, s.id); host != to {
		t.Fatalf("after the drain the session is on %q, want %s", host, to)
	}
	out := toolOutput(t, s.turn(checkCommand))
	alive, a, c := parseCheck(out)
	if !alive || a < atPause || c <= a || !strings.HasPrefix(out, fleet.MovedNotice[scheduler.MovedLive]) {
		t.Fatalf("after the live move of a paused sandbox: %q (the counter was %d at the pause)", out, atPause)
	}
	t.Logf("counter %d at the pause, %d then %d after the move", atPause, a, c)
}
