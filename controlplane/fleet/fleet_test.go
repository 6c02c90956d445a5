package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
	"corral.dev/corral/test/fleettest"
)

func sh(script string) tools.ExecRequest {
	return tools.ExecRequest{Command: []string{"sh", "-c", script}, Timeout: time.Minute, MaxOutput: 1 << 16}
}

func run(t *testing.T, sb tools.Sandbox, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := sb.Exec(ctx, sh(script))
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%s: exit %d: %s", script, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// counting is a node whose reads are counted.
type counting struct {
	*raftfsm.Node
	reads, waits atomic.Int64
}

func (c *counting) Read(fn func(v raftfsm.View)) { c.reads.Add(1); c.Node.Read(fn) }
func (c *counting) Changed() <-chan struct{}     { c.waits.Add(1); return c.Node.Changed() }

// TestWarmToolCallReadsStateOnce: once a session's sandbox is ready, a tool
// call reads this node's state once and waits on nothing before its RPC.
func TestWarmToolCallReadsStateOnce(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	c.StartHost("h1", fleettest.HostOptions{})
	i := c.Follower()
	node := &counting{Node: c.Node(i)}
	f, err := fleet.New(fleet.Config{Cluster: node, Credentials: c.Hosts(i).SandboxCredentials,
		Request:  scheduler.Request{Runtime: "process", Resources: scheduler.Resources{CPUMillis: 500}},
		Sessions: c.Sessions, Notices: c.Sessions})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c.Sessions.Add("sesn_warm")
	ctx := c.Ctx()
	cold, err := f.SandboxFor(ctx, "sesn_warm")
	if err != nil {
		t.Fatal(err)
	}
	if run(t, cold, "echo cold") != "cold\n" {
		t.Fatal("cold call")
	}
	for n := range 5 {
		node.reads.Store(0)
		node.waits.Store(0)
		sb, err := f.SandboxFor(ctx, "sesn_warm")
		if err != nil {
			t.Fatal(err)
		}
		if r, w := node.reads.Load(), node.waits.Load(); r != 1 || w != 0 {
			t.Fatalf("warm call %d: %d reads of the state and %d waits before the RPC, want 1 and 0", n, r, w)
		}
		if got := run(t, sb, fmt.Sprintf("echo %d", n)); got != fmt.Sprintf("%d\n", n) {
			t.Fatalf("warm call %d: %q", n, got)
		}
		if r := node.reads.Load(); r != 1 {
			t.Fatalf("warm call %d: the exec read the state %d more times", n, r-1)
		}
	}
}

func TestDrainMovesWorkspaces(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	c.StartHost("h1", fleettest.HostOptions{})
	i := c.Follower()
	ids := []string{"sesn_1", "sesn_2", "sesn_3"}
	for _, id := range ids {
		sb := c.Sandbox(i, id)
		run(t, sb, "mkdir -p dir && echo state of "+id+" > dir/state.txt")
	}
	c.StartHost("h2", fleettest.HostOptions{})
	var steps []fleet.DrainProgress
	if err := c.Fleet(i).Drain(context.Background(), "h1", time.Minute, func(p fleet.DrainProgress) { steps = append(steps, p) }); err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 || steps[2].Done != 3 || steps[2].Total != 3 {
		t.Fatalf("progress %+v", steps)
	}
	for _, st := range steps {
		if st.State != fleet.DrainMoved || st.To != "h2" || st.Err != nil {
			t.Fatalf("step %+v", st)
		}
	}
	for _, id := range ids {
		if p, _ := c.Placement(i, id); p.HostID != "h2" || p.Fence != nil {
			t.Fatalf("%s: %+v", id, p)
		}
		// The next tool call, through another node, runs on h2 and sees it.
		if got := run(t, c.Sandbox(c.Leader(), id), "cat dir/state.txt"); got != "state of "+id+"\n" {
			t.Fatalf("%s on h2: %q", id, got)
		}
	}
	if h := c.HostRecord(i, "h1"); h.Eligible || !h.Draining {
		t.Fatalf("drained host %+v", h)
	}
	waitfor.Cond(t, 10*time.Second, "the old sandboxes to go", func() bool {
		_, err := c.ReadFile("h1", "sesn_1", "dir/state.txt")
		return errdefs.IsNotFound(err)
	})
}

func TestDrainUnknownHost(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{})
	c.StartHost("h1", fleettest.HostOptions{})
	f := c.Fleet(0)
	if err := f.Drain(context.Background(), "nope", time.Minute, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("draining an unknown host: %v", err)
	}
	c.Node(0).Read(func(v raftfsm.View) {
		if _, ok := v.Host("nope"); ok || len(v.Hosts()) != 1 {
			t.Fatal("state changed")
		}
	})
	if err := f.Drain(context.Background(), "h1", 0, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("zero deadline: %v", err)
	}
	if err := f.Evict(context.Background(), "sesn_none"); !errdefs.IsNotFound(err) {
		t.Fatalf("evicting a session without a sandbox: %v", err)
	}
}

// TestDrainMovesBetweenToolCalls: a command in flight holds its sandbox on
// its host (the drain comes back to it, and at the deadline evicts it); a
// tool call made while a sandbox is being moved waits and runs where it
// went; no call fails and none is lost.
func TestDrainMovesBetweenToolCalls(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	c.StartHost("h1", fleettest.HostOptions{})
	i := c.Follower()
	busy, idle := c.Sandbox(i, "sesn_busy"), c.Sandbox(i, "sesn_idle")
	c.StartHost("h2", fleettest.HostOptions{})

	// A long command on busy, running until the test ends.
	started := make(chan struct{})
	type outcome struct {
		res tools.ExecResult
		err error
	}
	long := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		go func() {
			waitfor.Cond(t, time.Minute, "the long command to start", func() bool {
				got, _ := c.ReadFile("h1", "sesn_busy", "started")
				return got != ""
			})
			close(started)
		}()
		req := sh("echo yes > started; while [ ! -e stop ]; do sleep 0.05; done")
		req.ExecutionID = "sesn_busy/long"
		res, err := busy.Exec(ctx, req)
		long <- outcome{res, err}
	}()
	<-started

	// Tool calls on idle, one after another, while the drain runs.
	var calls atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var callErr error
	wg.Go(func() {
		for n := 0; n < 1000; n++ {
			select {
			case <-stop:
				return
			default:
			}
			// A fresh handle each time, as the tools get one per call.
			sb, err := c.Fleet(i).SandboxFor(c.Ctx(), "sesn_idle")
			if err == nil {
				req := sh(fmt.Sprintf("echo %d >> calls", n))
				req.ExecutionID = fmt.Sprintf("sesn_idle/%d", n)
				_, err = sb.Exec(context.Background(), req)
			}
			if err != nil {
				callErr = fmt.Errorf("call %d: %w", n, err)
				return
			}
			calls.Add(1)
		}
	})
	var steps []fleet.DrainProgress
	err := c.Fleet(i).Drain(context.Background(), "h1", 4*time.Second, func(p fleet.DrainProgress) { steps = append(steps, p) })
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if callErr != nil {
		t.Fatalf("a tool call failed during the drain: %v", callErr)
	}
	states := map[string][]fleet.DrainState{}
	for _, st := range steps {
		states[st.SessionID] = append(states[st.SessionID], st.State)
	}
	if s := states["sesn_idle"]; len(s) == 0 || s[len(s)-1] != fleet.DrainMoved {
		t.Fatalf("idle: %v (progress %+v)", s, steps)
	}
	if s := states["sesn_busy"]; len(s) < 2 || s[0] != fleet.DrainRetrying || s[len(s)-1] != fleet.DrainEvicted {
		t.Fatalf("busy: %v, want retrying until evicted (progress %+v)", s, steps)
	}
	if _, ok := c.Placement(i, "sesn_busy"); ok {
		t.Fatal("the evicted session is still placed")
	}
	// The eviction destroyed the sandbox and killed its command.
	if o := <-long; o.err == nil && o.res.ExitCode == 0 {
		t.Fatalf("the evicted sandbox's command ended well: %+v", o.res)
	}
	// Every call that returned ran once, in order, and the workspace moved
	// with them: the file on h2 has every line.
	n := calls.Load()
	got := run(t, idle, "cat calls")
	var want strings.Builder
	for k := range n {
		fmt.Fprintf(&want, "%d\n", k)
	}
	if got != want.String() {
		t.Fatalf("after %d calls the file holds %q", n, got)
	}
	if p, _ := c.Placement(i, "sesn_idle"); p.HostID != "h2" {
		t.Fatalf("idle on %s", p.HostID)
	}
	t.Logf("%d tool calls during the drain, none failed", n)
}

func TestHostLossReschedules(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	h1 := c.StartHost("h1", fleettest.HostOptions{})
	i := c.Follower()
	run(t, c.Sandbox(i, "sesn_1"), "echo gone > file")
	c.Sandbox(i, "sesn_2")
	c.Sessions.Add("other_key")
	c.StartHost("h2", fleettest.HostOptions{})
	stopped := time.Now()
	h1.Stop()
	for _, id := range []string{"sesn_1", "sesn_2"} {
		if got := c.Sessions.WaitRescheduled(t, id, 1, 30*time.Second); got[0] != "h1>h2" {
			t.Fatalf("%s rescheduled %v", id, got)
		}
	}
	if took := time.Since(stopped); took < 2*time.Second {
		t.Fatalf("rescheduled %v after the host stopped, before the TTL", took)
	}
	// The next tool call says the sandbox was replaced, once, and runs in
	// the new, empty one. (Node i may apply the move a moment after the
	// leader recorded it.)
	ctx := c.Ctx()
	if err := c.Node(i).Wait(ctx, func(v raftfsm.View) bool { p, _ := v.Placement("sesn_1"); return p.HostID == "h2" }); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Fleet(i).SandboxFor(ctx, "sesn_1")
	if err != nil {
		t.Fatal(err)
	}
	rep, ok := sb.(tools.Replaced)
	if !ok || rep.Notice != fleet.ReplacedNotice {
		t.Fatalf("first call after the loss: %T, want a replacement notice", sb)
	}
	if got := run(t, rep.Sandbox, "ls"); got != "" {
		t.Fatalf("new sandbox holds %q", got)
	}
	if sb, err := c.Fleet(i).SandboxFor(ctx, "sesn_1"); err != nil {
		t.Fatal(err)
	} else if _, again := sb.(tools.Replaced); again {
		t.Fatal("the replacement was told twice")
	}
	if h := c.HostRecord(i, "h1"); h.Status != scheduler.StatusDown {
		t.Fatalf("h1 is %s", h.Status)
	}
}

// TestDrainGVisor drains a host whose sandboxes are gVisor sandboxes: the
// session's files, one written through the file API and one made inside
// the sandbox, move with it, and its next tool call runs on the other
// host and sees them.
func TestDrainGVisor(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3, Runtime: containerd.RuntimeGVisor, Image: "localhost/corral/busybox:1",
		Resources: scheduler.Resources{CPUMillis: 1000, MemoryMiB: 512},
		NewDriver: func(t testing.TB) driver.Driver {
			return containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
		}})
	c.StartHost("h1", fleettest.HostOptions{})
	i := c.Follower()
	sb := c.Sandbox(i, "sesn_g")
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "src/main.txt", []byte("written through WriteFile\n"), 0); err != nil {
		t.Fatal(err)
	}
	run(t, sb, "mkdir -p out && echo made-in-gvisor > out/result.txt")
	c.StartHost("h2", fleettest.HostOptions{})
	var steps []fleet.DrainProgress
	if err := c.Fleet(i).Drain(ctx, "h1", 5*time.Minute, func(p fleet.DrainProgress) { steps = append(steps, p) }); err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].State != fleet.DrainMoved || steps[0].To != "h2" {
		t.Fatalf("progress %+v", steps)
	}
	// The same handle follows the sandbox to its new host.
	if got := run(t, sb, "cat src/main.txt out/result.txt"); got != "written through WriteFile\nmade-in-gvisor\n" {
		t.Fatalf("files on the new host: %q", got)
	}
	waitfor.Cond(t, 30*time.Second, "the old sandbox to go", func() bool {
		_, err := c.ReadFile("h1", "sesn_g", "src/main.txt")
		return errdefs.IsNotFound(err)
	})
}

// TestDrainOutlivesItsCallerAndItsLeader: a drain is kept in Raft. The call
// that starts it returns at once; the leader runs it; when the leader dies
// mid-drain the next one takes it up, and it ends with every sandbox moved
// and its record finished, which any node can follow.
func TestDrainOutlivesItsCallerAndItsLeader(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	c.StartHost("h1", fleettest.HostOptions{})
	i := c.Follower()
	busy := c.Sandbox(i, "sesn_busy")
	run(t, c.Sandbox(i, "sesn_idle"), "echo idle > state")
	c.StartHost("h2", fleettest.HostOptions{})

	// A command holds sesn_busy on h1 until the file stop appears.
	started := make(chan struct{})
	long := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req := sh("echo yes > started; while [ ! -e stop ]; do sleep 0.05; done; echo busy > state")
		req.ExecutionID = "sesn_busy/long"
		_, err := busy.Exec(ctx, req)
		long <- err
	}()
	go func() {
		waitfor.Cond(t, time.Minute, "the long command to start", func() bool {
			got, _ := c.ReadFile("h1", "sesn_busy", "started")
			return got != ""
		})
		close(started)
	}()
	waitfor.Closed(t, time.Minute, "the long command to start", started)

	leader := c.Leader()
	d, err := c.Fleet(i).StartDrain(context.Background(), "h1", fleet.DrainOptions{Deadline: 2 * time.Minute, MaxParallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	if d.Total != 2 || d.MaxParallel != 2 || !d.Running() {
		t.Fatalf("drain started as %+v", d)
	}
	// Asking again follows the same drain.
	if again, err := c.Fleet(leader).StartDrain(context.Background(), "h1", fleet.DrainOptions{Deadline: time.Minute}); err != nil || !again.Started.Equal(d.Started) {
		t.Fatalf("a second start: %+v, %v", again, err)
	}
	// The idle one moves; the busy one waits for its command.
	follow := func(node int, until func(raftfsm.Drain) bool) raftfsm.Drain {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var last raftfsm.Drain
		err := c.Fleet(node).WatchDrain(ctx, "h1", 0, func(d raftfsm.Drain, _ []raftfsm.DrainStep) {
			last = d
			if until(d) {
				cancel()
			}
		})
		if err != nil && !until(last) {
			t.Fatalf("following the drain from node %d: %v (last %+v)", node, err, last)
		}
		return last
	}
	follow(i, func(d raftfsm.Drain) bool { return d.Moved == 1 })
	if p, _ := c.Placement(i, "sesn_busy"); p.HostID != "h1" {
		t.Fatalf("the busy sandbox moved under its command: %+v", p)
	}

	// The leader, which runs the drain, dies; the command then ends.
	c.Kill(leader)
	// (A move's attempt at the fence refuses other writes for a moment:
	// the command holds the sandbox, so the attempt gives up.)
	waitfor.State(t, time.Minute, "the stop file written", func() (bool, string) {
		_, err := c.SandboxClient("h1").WriteFile(context.Background(), &pb.WriteFileRequest{Key: "sesn_busy", Path: "stop", Data: []byte("1")})
		return err == nil, fmt.Sprint(err)
	})
	if err := waitfor.Chan(t, time.Minute, "the long command", long); err != nil {
		t.Fatalf("the long command: %v", err)
	}

	// The new leader finishes the drain; a node that never ran it follows
	// it to the end.
	other := 3 - i - leader
	done := follow(other, func(d raftfsm.Drain) bool { return !d.Running() })
	if done.Running() || done.Moved != 2 || done.Evicted != 0 || done.Remaining() != 0 {
		t.Fatalf("the drain ended as %+v", done)
	}
	for _, id := range []string{"sesn_idle", "sesn_busy"} {
		if p, _ := c.Placement(other, id); p.HostID != "h2" {
			t.Fatalf("%s on %q after the drain", id, p.HostID)
		}
	}
	if got := run(t, c.Sandbox(other, "sesn_busy"), "cat state"); got != "busy\n" {
		t.Fatalf("sesn_busy's workspace on h2: %q", got)
	}
	if h := c.HostRecord(other, "h1"); h.Eligible || !h.Draining {
		t.Fatalf("drained host %+v", h)
	}
}

// TestUncordonStopsADrain: uncordoning a draining host stops its drain:
// its record goes, a follower is told, and what has not moved stays.
func TestUncordonStopsADrain(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 1})
	c.StartHost("h1", fleettest.HostOptions{})
	busy := c.Sandbox(0, "sesn_busy")
	// No other host: nothing can move, the drain goes on retrying.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Fleet(0).StartDrain(ctx, "h1", fleet.DrainOptions{Deadline: time.Hour}); err != nil {
		t.Fatal(err)
	}
	watched, following := make(chan error, 1), make(chan struct{})
	go func() {
		var once sync.Once
		watched <- c.Fleet(0).WatchDrain(ctx, "h1", 0, func(raftfsm.Drain, []raftfsm.DrainStep) { once.Do(func() { close(following) }) })
	}()
	waitfor.Closed(t, time.Minute, "the follower to start", following)
	if _, err := c.Hosts(0).Uncordon(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if err := waitfor.Chan(t, time.Minute, "the follower to be told", watched); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("following a drain stopped by an uncordon: %v", err)
	}
	var running []raftfsm.Drain
	c.Node(0).Read(func(v raftfsm.View) { running = v.RunningDrains() })
	if len(running) != 0 {
		t.Fatalf("drains running after the uncordon: %+v", running)
	}
	if h := c.HostRecord(0, "h1"); !h.Eligible || h.Draining {
		t.Fatalf("uncordoned host %+v", h)
	}
	if got := run(t, busy, "echo still here"); got != "still here\n" {
		t.Fatalf("the sandbox after the uncordon: %q", got)
	}
	if err := c.Fleet(0).WatchDrain(ctx, "h1", 0, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("following the drain of an uncordoned host: %v", err)
	}
}
