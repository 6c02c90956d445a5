package raftfsm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
)

// testConfig is a node config with test-sized Raft timeouts.
func testConfig(id, dir string) Config {
	cfg := Config{
		ID: id, RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: dir,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond, ApplyTimeout: 5 * time.Second,
	}
	if testing.Verbose() && os.Getenv("RAFT_LOG") != "" {
		cfg.RaftLogOutput = os.Stderr
	}
	return cfg
}

// joinVia makes cfg a first join through via: a fresh one-time node token,
// the cluster's seal keyring.
func joinVia(t testing.TB, via *Node, cfg *Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok, err := via.IssueNodeToken(ctx, time.Minute)
	if err != nil {
		t.Fatalf("issuing a node token on %s: %v", via.ID(), err)
	}
	cfg.Join, cfg.NodeJoinToken, cfg.Seal = via.HTTPAddr(), logging.Secret(tok.Reveal()), via.Keyring()
}

func startNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("starting %s: %v", cfg.ID, err)
	}
	t.Cleanup(func() { _ = n.Shutdown() })
	return n
}

// place plans req over n's state and commits the plan, as the fleet does;
// the FSM plans again when the plan went stale.
func place(ctx context.Context, n *Node, req scheduler.Request) (scheduler.Placement, error) {
	var (
		plan scheduler.Plan
		p    scheduler.Placement
		err  error
	)
	cfg := scheduler.Config{}
	n.Read(func(v View) {
		if plan, err = scheduler.Place(v, req, cfg); err == nil && plan.Existing {
			p, _ = v.Placement(req.SessionID)
		}
	})
	if err != nil || plan.Existing {
		return p, err
	}
	return Apply(ctx, n, Place, Key("place/"+req.SessionID), PlacePayload{Plan: plan, Request: &req, Config: &cfg})
}

// leaderOf returns the node that leads, among nodes, once all of them agree.
func leaderOf(t *testing.T, nodes ...*Node) *Node {
	t.Helper()
	var leader *Node
	waitfor.Cond(t, 30*time.Second, "an agreed leader", func() bool {
		leader = nil
		for _, n := range nodes {
			if n.IsLeader() {
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range nodes {
			if n.Leader() != leader.ID() || n.leaderHTTP() == "" {
				return false
			}
		}
		return true
	})
	return leader
}

// clusterSetup starts a 3-node cluster: n1 bootstraps, n2 and n3 join it.
func clusterSetup(t *testing.T) ([]*Node, []Config) {
	t.Helper()
	cfgs := make([]Config, 3)
	nodes := make([]*Node, 3)
	for i := range cfgs {
		cfgs[i] = testConfig(fmt.Sprintf("n%d", i+1), t.TempDir())
		cfgs[i].TrailingLogs = 5
	}
	cfgs[0].Bootstrap = true
	nodes[0] = startNode(t, cfgs[0])
	leaderOf(t, nodes[0])
	for i := 1; i < 3; i++ {
		// n3 joins through n2, a follower, which points it at the leader.
		joinVia(t, nodes[i-1], &cfgs[i])
		nodes[i] = startNode(t, cfgs[i])
	}
	leaderOf(t, nodes...)
	// Later restarts reuse the addresses each node got.
	for i, n := range nodes {
		cfgs[i].RaftAddr, cfgs[i].HTTPAddr, cfgs[i].Join = n.RaftAddr(), n.HTTPAddr(), ""
	}
	return nodes, cfgs
}

func follower(nodes []*Node, leader *Node) *Node {
	for _, n := range nodes {
		if n != leader {
			return n
		}
	}
	return nil
}

func registerHosts(t *testing.T, ctx context.Context, via *Node, n int) {
	t.Helper()
	for _, h := range schedulertest.Fleet(n, 64000, 256<<10) {
		if _, err := Apply(ctx, via, RegisterHost, "host/"+h.ID, h); err != nil {
			t.Fatalf("registering %s: %v", h.ID, err)
		}
	}
}

func sessionReq(i int) scheduler.Request {
	return scheduler.Request{SessionID: fmt.Sprintf("s-%04d", i), Tenant: fmt.Sprintf("t%d", i%3), Runtime: "runsc",
		Resources: scheduler.Resources{CPUMillis: 500, MemoryMiB: 512}}
}

// placeMany places sessions [from, to) concurrently through via and returns
// the sandbox id each got.
func placeMany(t *testing.T, ctx context.Context, via *Node, from, to int) map[string]string {
	t.Helper()
	var (
		mu  sync.Mutex
		got = map[string]string{}
		wg  sync.WaitGroup
	)
	for i := from; i < to; i++ {
		wg.Go(func() {
			p, err := place(ctx, via, sessionReq(i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("placing %d: %v", i, err)
				return
			}
			got[p.SessionID] = p.SandboxID
		})
	}
	wg.Wait()
	return got
}

// checkPlacements verifies, on the leader, that exactly want placements
// exist, with the sandbox ids their callers got, and that host allocations
// and tenant usage add up. It reads linearizably; should leadership move
// meanwhile (an election on a busy machine), it waits instead until the
// node has applied every placement its callers were told of, and reads
// that.
func checkPlacements(t *testing.T, ctx context.Context, leader *Node, want map[string]string) {
	t.Helper()
	check := func(v View) {
		ps := v.Placements()
		if len(ps) != len(want) {
			t.Errorf("%d placements, want %d", len(ps), len(want))
		}
		var sandboxes, cpu int64
		seen := map[string]bool{}
		for _, p := range ps {
			if want[p.SessionID] != p.SandboxID {
				t.Errorf("session %s: sandbox %q, caller got %q", p.SessionID, p.SandboxID, want[p.SessionID])
			}
			if seen[p.SandboxID] {
				t.Errorf("sandbox %s placed twice", p.SandboxID)
			}
			seen[p.SandboxID] = true
		}
		for _, h := range v.Hosts() {
			cpu += h.Allocated.CPUMillis
		}
		for _, tenant := range []string{"t0", "t1", "t2"} {
			sandboxes += int64(v.Usage(tenant).Sandboxes)
		}
		if cpu != int64(len(want))*500 || sandboxes != int64(len(want)) {
			t.Errorf("allocated cpu %d, usage %d sandboxes, for %d placements", cpu, sandboxes, len(want))
		}
	}
	err := leader.ReadConsistent(ctx, check)
	if errdefs.KindOf(err) == errdefs.UnavailableKind {
		t.Logf("%s no longer leads (%v): checking its applied state", leader.ID(), err)
		if err = leader.Wait(ctx, func(v View) bool {
			for id, sb := range want {
				if p, ok := v.Placement(id); !ok || p.SandboxID != sb {
					return false
				}
			}
			return true
		}); err == nil {
			leader.Read(check)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestClusterFailoverAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts a 3-node raft cluster on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes, cfgs := clusterSetup(t)
	leader := leaderOf(t, nodes...)
	fol := follower(nodes, leader)

	// Writes through a follower are forwarded to the leader.
	registerHosts(t, ctx, fol, 10)
	placed := placeMany(t, ctx, fol, 0, 50)
	checkPlacements(t, ctx, leader, placed)

	// Placing a session again, through another node, returns its placement.
	for _, n := range nodes {
		waitfor.Cond(t, 30*time.Second, n.ID()+" catching up", func() bool { return n.AppliedIndex() >= leader.AppliedIndex() })
		p, err := place(ctx, n, sessionReq(7))
		if err != nil || p.SandboxID != placed[p.SessionID] {
			t.Fatalf("placing s-0007 again via %s: %+v %v, want sandbox %s", n.ID(), p, err, placed["s-0007"])
		}
	}
	// A command's error crosses the forwarding hop with its kind and message.
	if _, err := Apply(ctx, fol, SetQuota, "", SetQuotaPayload{Tenant: "small", Quota: scheduler.Quota{MemoryMiB: 100}}); err != nil {
		t.Fatalf("setting a quota through a follower: %v", err)
	}
	small := sessionReq(999)
	small.Tenant = "small"
	if _, err := place(ctx, fol, small); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), "memory_mib") {
		t.Fatalf("placing over quota through a follower: %v, want resource exhausted naming memory_mib", err)
	}
	if err := fol.ReadConsistent(ctx, func(View) {}); errdefs.KindOf(err) != errdefs.UnavailableKind {
		t.Fatalf("linearizable read on a follower: %v, want unavailable", err)
	}

	// Kill the leader: the others elect a new one, which serves.
	oldIdx := -1
	for i, n := range nodes {
		if n == leader {
			oldIdx = i
		}
	}
	start := time.Now()
	if err := leader.Shutdown(); err != nil {
		t.Fatalf("shutting down the leader: %v", err)
	}
	rest := append(append([]*Node(nil), nodes[:oldIdx]...), nodes[oldIdx+1:]...)
	newLeader := leaderOf(t, rest...)
	t.Logf("new leader %s elected %v after the old one stopped", newLeader.ID(), time.Since(start))
	for k, v := range placeMany(t, ctx, follower(rest, newLeader), 50, 100) {
		placed[k] = v
	}
	checkPlacements(t, ctx, newLeader, placed)

	// Restart the old leader from its data directory: it catches up.
	cfg := cfgs[oldIdx]
	cfg.Bootstrap = false
	restarted := startNode(t, cfg)
	waitfor.Cond(t, 30*time.Second, "the restarted node to catch up", func() bool {
		n := 0
		restarted.Read(func(v View) { n = len(v.Placements()) })
		return n == len(placed)
	})
	restarted.Read(func(v View) {
		for _, p := range v.Placements() {
			if placed[p.SessionID] != p.SandboxID {
				t.Errorf("restarted node has %s on sandbox %s, want %s", p.SessionID, p.SandboxID, placed[p.SessionID])
			}
		}
	})
	// And it forwards writes to the new leader.
	if p, err := place(ctx, restarted, sessionReq(100)); err != nil || p.SandboxID == "" {
		t.Fatalf("placing through the restarted node: %+v %v", p, err)
	}
}

func TestMembership(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts raft nodes on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := testConfig("solo", t.TempDir())
	cfg.Bootstrap = true
	solo := startNode(t, cfg)
	leaderOf(t, solo)

	if err := solo.RemoveServer(ctx, "solo"); errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
		t.Fatalf("removing the last voter: %v, want failed precondition", err)
	}
	if err := solo.RemoveServer(ctx, "ghost"); errdefs.KindOf(err) != errdefs.NotFoundKind {
		t.Fatalf("removing an unknown node: %v, want not found", err)
	}

	// Add a second node by explicit AddVoter, then remove it through the other.
	cfg2 := testConfig("second", t.TempDir())
	joinVia(t, solo, &cfg2)
	second := startNode(t, cfg2)
	if err := solo.AddVoter(ctx, "second", second.RaftAddr(), second.HTTPAddr()); err != nil {
		t.Fatal(err)
	}
	waitfor.Cond(t, 30*time.Second, "second to know the leader", func() bool { return second.leaderHTTP() != "" })
	servers, err := solo.Members()
	if err != nil || len(servers) != 2 {
		t.Fatalf("members %v %v", servers, err)
	}
	if err := second.RemoveServer(ctx, "second"); err != nil {
		t.Fatalf("removing second through itself (forwarded): %v", err)
	}
	servers, _ = solo.Members()
	if len(servers) != 1 || servers[0].ID != "solo" {
		t.Fatalf("members after removal: %v", servers)
	}
	solo.Read(func(v View) {
		if v.Member("second") != "" {
			t.Fatal("removed member's address still recorded")
		}
	})
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{ID: "a"},
		{ID: "a", RaftAddr: "127.0.0.1:0"},
		{ID: "a", RaftAddr: "127.0.0.1:0", DataDir: "/tmp/x", Bootstrap: true, Join: "127.0.0.1:1"},
	} {
		if err := c.Validate(); errdefs.KindOf(err) != errdefs.InvalidArgumentKind {
			t.Errorf("%+v: %v, want invalid argument", c, err)
		}
	}
}

func TestLeaderKilledDuringPlacements(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts a 3-node raft cluster on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes, _ := clusterSetup(t)
	leader := leaderOf(t, nodes...)
	fol := follower(nodes, leader)
	registerHosts(t, ctx, fol, 20)

	// Place 300 sessions through a follower; stop the leader once 50 are in.
	const total = 300
	var (
		mu     sync.Mutex
		placed = map[string]string{}
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 32)
		fifty  = make(chan struct{})
		once   sync.Once
	)
	for i := range total {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p, err := place(ctx, fol, sessionReq(i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("placing %d: %v", i, err)
				return
			}
			if old, dup := placed[p.SessionID]; dup {
				t.Errorf("session %s answered twice (%s, %s)", p.SessionID, old, p.SandboxID)
			}
			placed[p.SessionID] = p.SandboxID
			if len(placed) == 50 {
				once.Do(func() { close(fifty) })
			}
		})
		if i == 100 {
			select {
			case <-fifty:
			case <-ctx.Done():
				t.Fatal("50 placements never completed")
			}
			start := time.Now()
			if err := leader.Shutdown(); err != nil {
				t.Errorf("stopping the leader: %v", err)
			}
			var rest []*Node
			for _, n := range nodes {
				if n != leader {
					rest = append(rest, n)
				}
			}
			leaderOf(t, rest...)
			t.Logf("new leader %v after the old one stopped, mid-stream", time.Since(start))
		}
	}
	wg.Wait()
	if len(placed) != total {
		t.Fatalf("%d sessions answered, want %d", len(placed), total)
	}
	var newLeader *Node
	for _, n := range nodes {
		if n != leader && n.IsLeader() {
			newLeader = n
		}
	}
	if newLeader == nil {
		t.Fatal("no leader among the survivors")
	}
	checkPlacements(t, ctx, newLeader, placed)
}

func TestApplyAfterShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts a raft node on loopback")
	}
	cfg := testConfig("solo", t.TempDir())
	cfg.Bootstrap = true
	n := startNode(t, cfg)
	leaderOf(t, n)
	if err := n.Shutdown(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Apply(ctx, n, Member, "", MemberPayload{ID: "x", HTTPAddr: "y"}); errdefs.KindOf(err) != errdefs.CanceledKind {
		t.Fatalf("apply on a stopped node: %v, want canceled", err)
	}
	if ctx.Err() != nil {
		t.Fatal("apply on a stopped node waited for the deadline")
	}
}

func TestSnapshotInstallAndFullRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts raft clusters on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes, cfgs := clusterSetup(t)
	leader := leaderOf(t, nodes...)
	registerHosts(t, ctx, leader, 5)
	placed := placeMany(t, ctx, leader, 0, 60)
	for _, n := range nodes {
		waitfor.Cond(t, 30*time.Second, n.ID()+" catching up", func() bool { return n.AppliedIndex() >= leader.AppliedIndex() })
		if err := n.Snapshot(); err != nil {
			t.Fatalf("snapshot on %s: %v", n.ID(), err)
		}
	}

	// A new node joins after the log was compacted: it can only catch up
	// by installing the leader's snapshot.
	cfg4 := testConfig("n4", t.TempDir())
	joinVia(t, leader, &cfg4)
	n4 := startNode(t, cfg4)
	// Start returned after the leader applied n4's member command, the last write.
	waitfor.Cond(t, 30*time.Second, "n4 to catch up", func() bool { return n4.AppliedIndex() >= leader.AppliedIndex() })
	n4.Read(func(v View) {
		if len(v.Placements()) != len(placed) {
			t.Fatalf("n4 has %d placements, want %d", len(v.Placements()), len(placed))
		}
	})
	snaps, err := os.ReadDir(filepath.Join(cfg4.DataDir, "snapshots"))
	if err != nil || len(snaps) == 0 {
		t.Fatalf("n4 has no installed snapshot: %v %v", snaps, err)
	}
	var recentLeader, recent4 int
	leader.Read(func(v View) { recentLeader = v.RecentKeys() })
	n4.Read(func(v View) { recent4 = v.RecentKeys() })
	if recent4 != recentLeader {
		t.Fatalf("n4 remembers %d idempotency keys, the leader %d", recent4, recentLeader)
	}
	if err := n4.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := leader.RemoveServer(ctx, "n4"); err != nil {
		t.Fatal(err)
	}

	// More writes after the snapshot, then stop and restart all three:
	// state comes back from snapshot plus log.
	for k, v := range placeMany(t, ctx, leader, 60, 80) {
		placed[k] = v
	}
	for _, n := range nodes {
		if err := n.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	restarted := make([]*Node, len(cfgs))
	for i, cfg := range cfgs {
		cfg.Bootstrap = false
		restarted[i] = startNode(t, cfg)
	}
	checkPlacements(t, ctx, leaderOf(t, restarted...), placed)
}

// A follower catching up a long log reports an applied index only for what
// its FSM holds: a read gated on AppliedIndex() >= i sees the write at i.
// (Raft's own AppliedIndex advances when a batch is handed to the FSM
// goroutine, before it is applied; gating on it lost writes in a restarted
// node's first reads.)
func TestAppliedIndexCoversWhatReadsSee(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts a raft cluster on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes, cfgs := clusterSetup(t)
	leader := leaderOf(t, nodes...)
	lagging := follower(nodes, leader)
	lagCfg := cfgs[slices.Index(nodes, lagging)]
	if err := lagging.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// Each write sets one tenant's quota; its log index is recorded.
	const writes, workers = 1500, 8
	at := make([]uint64, writes)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < writes; i += workers {
				// The raw path: this test needs each write's index.
				c, _ := NewCommand(CmdSetQuota, "", SetQuotaPayload{Tenant: fmt.Sprintf("t%d", i), Quota: scheduler.Quota{MemoryMiB: int64(i + 1)}})
				r, err := leader.applyCommand(ctx, c)
				if err != nil || r.Error() != nil {
					t.Errorf("write %d: %v %v", i, err, r.Error())
					return
				}
				at[i] = r.Index
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	last := slices.Max(at)

	restarted := startNode(t, lagCfg)
	polls := 0
	for {
		idx := restarted.AppliedIndex()
		restarted.Read(func(v View) {
			for i, w := range at {
				if w <= idx && v.Quota(fmt.Sprintf("t%d", i)).MemoryMiB != int64(i+1) {
					t.Fatalf("applied index %d, but the write at %d (t%d) is not visible", idx, w, i)
				}
			}
		})
		polls++
		if idx >= last {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted node at index %d of %d after 60s", idx, last)
		}
		time.Sleep(100 * time.Microsecond) // polling closely, to look between batches
	}
	t.Logf("caught up to index %d in %d polls", last, polls)
}
