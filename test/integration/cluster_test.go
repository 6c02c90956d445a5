package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Raft timers of the cluster tests' nodes.
const (
	testHeartbeat = 250 * time.Millisecond
	testElection  = time.Second
)

// serverNode is one `corral server` process of a test cluster.
type serverNode struct {
	id                 string
	dir                string
	grpcAddr, raftHTTP string
	httpAddr           string   // the public API
	hostAddr           string   // the host service, for host agents
	args               []string // everything but --bootstrap/--join
	wrap               []string // command prefix (ip netns exec ...), or none
	proc               *devProcess
	conn               *grpc.ClientConn
	key                string // an operator key, sent with every admin call
}

// operatorKeys holds one operator key per test database.
var operatorKeys sync.Map // *pgtest.DB → string

// operatorKey returns an operator key of db's cluster, and puts it in
// CORRAL_OPERATOR_KEY for the corral CLI verbs the test runs.
func operatorKey(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	if k, ok := operatorKeys.Load(db); ok {
		return k.(string)
	}
	_, secret, err := store.BootstrapOperatorKey(context.Background(), db.OwnerURL, "cluster-test", []string{"operator"})
	if err != nil {
		t.Fatal(err)
	}
	operatorKeys.Store(db, string(secret))
	t.Setenv("CORRAL_OPERATOR_KEY", string(secret))
	return string(secret)
}

// newServerNode prepares a node on db with its addresses on loopback.
func newServerNode(t *testing.T, db *pgtest.DB, id string, extra ...string) *serverNode {
	t.Helper()
	n := &serverNode{id: id, dir: t.TempDir(), grpcAddr: freeAddr(t), raftHTTP: freeAddr(t), httpAddr: freeAddr(t), hostAddr: freeAddr(t), key: operatorKey(t, db)}
	n.args = serverArgs(db, id, n.dir, n.httpAddr, n.grpcAddr, freeAddr(t), n.raftHTTP, append([]string{"--host-addr", n.hostAddr}, extra...)...)
	n.dial(t)
	return n
}

func serverArgs(db *pgtest.DB, id, dir, httpAddr, grpcAddr, raftAddr, raftHTTP string, extra ...string) []string {
	return append([]string{"server", "--node-id", id, "--data-dir", dir,
		"--database-url", db.AppURL, "--migration-database-url", db.OwnerURL,
		"--http-addr", httpAddr, "--grpc-addr", grpcAddr,
		"--raft-addr", raftAddr, "--raft-http-addr", raftHTTP,
		// Any free port: the nodes share this machine.
		"--host-addr", "127.0.0.1:0",
		"--raft-heartbeat-timeout", testHeartbeat.String(), "--raft-election-timeout", testElection.String(),
		"--seal-key-file", testSealKey,
	}, extra...)
}

// joinArgs are the flags of a first start that joins via's cluster: a
// node join token minted on via with `corral admin node-token`, as an
// operator does on a member.
func joinArgs(t *testing.T, via *serverNode) []string {
	t.Helper()
	args := append(append([]string{}, via.wrap...), corralBin, "admin", "node-token",
		"--data-dir", via.dir, "--raft-http-addr", via.raftHTTP, "--seal-key-file", testSealKey, "--ttl", "10m")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if err != nil {
		t.Fatalf("minting a node join token on %s: %v", via.id, err)
	}
	return []string{"--join", via.raftHTTP, "--node-join-token", strings.TrimSpace(string(out))}
}

// dial connects the test's admin client, through opts (a dialer into a
// network namespace, say).
func (n *serverNode) dial(t *testing.T, opts ...grpc.DialOption) {
	t.Helper()
	withKey := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "x-api-key", n.key)
	}
	conn, err := grpc.NewClient(n.grpcAddr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
			return invoker(withKey(ctx), method, req, reply, cc, o...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withKey(ctx), desc, cc, method, o...)
		}),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n.conn = conn
}

// start runs the node's process and waits until it serves.
func (n *serverNode) start(t *testing.T, first ...string) {
	t.Helper()
	args := append(append(append([]string{}, n.wrap...), corralBin), append(append([]string{}, n.args...), first...)...)
	cmd := exec.Command(args[0], args[1:]...)
	p := &devProcess{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("%s's log:\n%s", n.id, lastLines(p.stderr.String(), 40))
		}
	})
	n.proc = p
	deadline := time.After(60 * time.Second)
	for !strings.Contains(p.stderr.String(), "corral server listening") {
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before listening:\n%s", n.id, p.waitErr, p.stderr.String())
		case <-deadline:
			t.Fatalf("%s did not listen within 60s:\n%s", n.id, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill stops the process at once (SIGKILL) and waits for it.
func (n *serverNode) kill() {
	n.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-n.proc.done
}

func (n *serverNode) status(ctx context.Context) (*adminv1.GetStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return adminv1.NewClusterServiceClient(n.conn).GetStatus(ctx, &adminv1.GetStatusRequest{})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// agreedLeader waits until every node in nodes reports the same leader,
// among them, and the same member count; it returns that leader.
func agreedLeader(t *testing.T, members int, nodes ...*serverNode) *serverNode {
	t.Helper()
	var leader *serverNode
	waitfor.Cond(t, 30*time.Second, "the nodes to agree on a leader", func() bool {
		leader = nil
		id := ""
		for _, n := range nodes {
			st, err := n.status(context.Background())
			if err != nil || st.GetLeaderId() == "" || len(st.GetMembers()) != members || (id != "" && st.GetLeaderId() != id) {
				return false
			}
			id = st.GetLeaderId()
		}
		for _, n := range nodes {
			if n.id == id {
				leader = n
			}
		}
		return leader != nil
	})
	return leader
}

// startCluster starts three nodes: the first bootstraps, the others join
// through it.
func startCluster(t *testing.T, db *pgtest.DB, extra ...string) []*serverNode {
	t.Helper()
	nodes := make([]*serverNode, 3)
	for i := range nodes {
		nodes[i] = newServerNode(t, db, fmt.Sprintf("n%d", i+1), extra...)
	}
	nodes[0].start(t, "--bootstrap")
	for _, n := range nodes[1:] {
		n.start(t, joinArgs(t, nodes[0])...)
	}
	agreedLeader(t, 3, nodes...)
	return nodes
}

func registerTestHosts(t *testing.T, ctx context.Context, via *serverNode, n int) {
	t.Helper()
	c := adminv1.NewHostsServiceClient(via.conn)
	for i := range n {
		_, err := c.RegisterHost(ctx, &adminv1.RegisterHostRequest{Host: &adminv1.Host{
			Id: fmt.Sprintf("host-%03d", i), Runtimes: []string{"runsc"},
			Capacity: &adminv1.Resources{CpuMillis: 64000, MemoryMib: 256 << 10, DiskMib: 1 << 20},
		}})
		if err != nil {
			t.Fatalf("registering host %d: %v", i, err)
		}
	}
}

// retryable reports whether a client should ask another node: the node is
// gone, has no leader, or did not answer in time.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// placements reads every placement from a node, keyed by session.
func placements(t *testing.T, n *serverNode) map[string]*adminv1.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adminv1.NewSandboxesServiceClient(n.conn).ListSandboxes(ctx, &adminv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatalf("listing sandboxes on %s: %v", n.id, err)
	}
	out := map[string]*adminv1.Sandbox{}
	for _, s := range resp.GetSandboxes() {
		if _, dup := out[s.GetSessionId()]; dup {
			t.Fatalf("%s lists session %s twice", n.id, s.GetSessionId())
		}
		out[s.GetSessionId()] = s
	}
	return out
}

// sameApplied waits until the nodes report one applied index and returns it.
func sameApplied(t *testing.T, nodes ...*serverNode) uint64 {
	t.Helper()
	var idx uint64
	waitfor.Cond(t, 30*time.Second, "the nodes to apply the same index", func() bool {
		for i, n := range nodes {
			st, err := n.status(context.Background())
			if err != nil || (i > 0 && st.GetAppliedIndex() != idx) {
				return false
			}
			idx = st.GetAppliedIndex()
		}
		return idx > 0
	})
	return idx
}

// checkAllocations checks that each host's allocation is the sum of its
// placements: a duplicated or lost placement would show here.
func checkAllocations(t *testing.T, n *serverNode, placed map[string]*adminv1.Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adminv1.NewHostsServiceClient(n.conn).ListHosts(ctx, &adminv1.ListHostsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]int64{}
	for _, s := range placed {
		sum[s.GetHostId()] += s.GetResources().GetCpuMillis()
	}
	for _, h := range resp.GetHosts() {
		if h.GetAllocated().GetCpuMillis() != sum[h.GetId()] {
			t.Errorf("host %s: allocated %dm, its placements sum to %dm", h.GetId(), h.GetAllocated().GetCpuMillis(), sum[h.GetId()])
		}
	}
}

// TestClusterLeaderKilledDuringPlacementsThenFullRestart runs three real
// nodes on loopback sharing one PostgreSQL. It kills the leader with SIGKILL
// while 1,000 placements are requested by clients spread over the nodes
// (retrying on another node with the same session key), then checks that a
// new leader served, every request got one answer and the replicated
// placements are exactly the answers; then it stops and restarts all three
// and checks that the state came back from snapshot plus log.
func TestClusterLeaderKilledDuringPlacementsThenFullRestart(t *testing.T) {
	db := pgtest.New(t)
	// Frequent snapshots, so the restart restores from one plus the log.
	nodes := startCluster(t, db, "--raft-snapshot-threshold", "200", "--raft-snapshot-interval", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	registerTestHosts(t, ctx, nodes[1], 20)
	leader := agreedLeader(t, 3, nodes...)

	const total, clients = 1000, 12
	keys := make(chan string, total)
	for i := range total {
		keys <- fmt.Sprintf("sess-%04d", i)
	}
	close(keys)
	var (
		mu       sync.Mutex
		answers  = map[string]*adminv1.Sandbox{}
		answered atomic.Int64
		retries  atomic.Int64
		killed   = make(chan struct{})
	)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			at := c % len(nodes)
			for key := range keys {
				// A hundred tenants, ten sandboxes each: within the
				// default quota's 20.
				req := &adminv1.PlaceSandboxRequest{Tenant: "tenant-" + key[len(key)-2:], SessionId: key, Runtime: "runsc",
					Resources: &adminv1.Resources{CpuMillis: 100, MemoryMib: 128}}
				for {
					cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
					resp, err := adminv1.NewSandboxesServiceClient(nodes[at].conn).PlaceSandbox(cctx, req)
					ccancel()
					if err != nil && retryable(err) && ctx.Err() == nil {
						retries.Add(1)
						at = (at + 1) % len(nodes)
						continue
					}
					if err != nil {
						t.Errorf("placing %s on %s: %v", key, nodes[at].id, err)
						break
					}
					mu.Lock()
					if prev, ok := answers[key]; ok {
						t.Errorf("%s answered twice: %v and %v", key, prev, resp.GetSandbox())
					}
					answers[key] = resp.GetSandbox()
					mu.Unlock()
					answered.Add(1)
					break
				}
			}
		})
	}

	// Kill the leader once a fifth of the answers are in, with the rest in
	// flight; measure how long until a survivor leads and commits a write.
	waitfor.Cond(t, time.Minute, "200 answers", func() bool { return answered.Load() >= 200 })
	killedAt := time.Now()
	leader.kill()
	close(killed)
	var survivors []*serverNode
	for _, n := range nodes {
		if n != leader {
			survivors = append(survivors, n)
		}
	}
	var elected time.Duration
	waitfor.Cond(t, 30*time.Second, "a survivor to lead", func() bool {
		for _, n := range survivors {
			if st, err := n.status(ctx); err == nil && st.GetRaftState() == "Leader" {
				elected = time.Since(killedAt)
				return true
			}
		}
		return false
	})
	var served time.Duration
	probe := &adminv1.PlaceSandboxRequest{Tenant: "probe", SessionId: "probe", Resources: &adminv1.Resources{CpuMillis: 100, MemoryMib: 128}}
	waitfor.Cond(t, 30*time.Second, "a write to commit after the kill", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer pcancel()
		_, err := adminv1.NewSandboxesServiceClient(survivors[0].conn).PlaceSandbox(pctx, probe)
		served = time.Since(killedAt)
		return err == nil
	})
	wg.Wait()
	t.Logf("leader %s killed after %d answers: a new leader in %v, the first write committed %v after the kill (election timeout %v, heartbeat timeout %v); %d client retries",
		leader.id, 200, elected.Round(time.Millisecond), served.Round(time.Millisecond), testElection, testHeartbeat, retries.Load())
	if elected > 10*testElection {
		t.Errorf("a new leader took %v, more than 10 election timeouts", elected)
	}
	if t.Failed() {
		return
	}
	if len(answers) != total {
		t.Fatalf("%d of %d requests answered", len(answers), total)
	}
	sameApplied(t, survivors...)
	for _, n := range survivors {
		got := placements(t, n)
		if len(got) != total+1 {
			t.Fatalf("%s holds %d placements, want %d answers plus the probe", n.id, len(got), total)
		}
		for key, want := range answers {
			if g := got[key]; g.GetSandboxId() != want.GetSandboxId() || g.GetHostId() != want.GetHostId() {
				t.Fatalf("%s: %s placed as %v, answered %v", n.id, key, g, want)
			}
		}
		checkAllocations(t, n, got)
	}

	// The killed node restarts from its data dir, rejoins and catches up.
	leader.start(t)
	idx := sameApplied(t, nodes...)
	if got := placements(t, leader); len(got) != total+1 {
		t.Fatalf("restarted %s holds %d placements at index %d", leader.id, len(got), idx)
	}

	// Full restart: every node has a snapshot; one more write lands in the
	// log; all three stop and start again.
	for _, n := range nodes {
		snaps, _ := filepath.Glob(filepath.Join(n.dir, "snapshots", "*", "state.bin"))
		waitfor.Cond(t, 30*time.Second, n.id+" to take a snapshot", func() bool {
			snaps, _ = filepath.Glob(filepath.Join(n.dir, "snapshots", "*", "state.bin"))
			return len(snaps) > 0
		})
	}
	if _, err := adminv1.NewHostsServiceClient(nodes[0].conn).CordonHost(ctx, &adminv1.CordonHostRequest{HostId: "host-007"}); err != nil {
		t.Fatal(err)
	}
	before := sameApplied(t, nodes...)
	want := placements(t, nodes[0])
	for _, n := range nodes {
		n.proc.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, n := range nodes {
		select {
		case <-n.proc.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("%s did not stop within 60s of SIGTERM", n.id)
		}
	}
	for _, n := range nodes {
		n.start(t)
	}
	agreedLeader(t, 3, nodes...)
	after := sameApplied(t, nodes...)
	if after < before {
		t.Fatalf("applied index %d after the restart, %d before", after, before)
	}
	for _, n := range nodes {
		got := placements(t, n)
		if len(got) != len(want) {
			t.Fatalf("%s holds %d placements after the restart, %d before", n.id, len(got), len(want))
		}
		for k, w := range want {
			if got[k].GetSandboxId() != w.GetSandboxId() {
				t.Fatalf("%s: %s is %v after the restart, %v before", n.id, k, got[k], w)
			}
		}
		hosts, err := adminv1.NewHostsServiceClient(n.conn).ListHosts(ctx, &adminv1.ListHostsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hosts.GetHosts() {
			if h.GetId() == "host-007" && h.GetEligible() {
				t.Fatalf("%s lost the cordon written after the snapshot", n.id)
			}
		}
	}

	// The operator verbs against the real nodes: uncordon, list, remove a
	// member.
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(corralBin, append(args, "--server", nodes[1].grpcAddr)...).CombinedOutput()
		if err != nil {
			t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	cli("hosts", "uncordon", "host-007")
	ls := cli("hosts", "ls")
	eligible := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(ls), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 2 {
			eligible[f[0]] = f[2]
		}
	}
	if len(eligible) != 20 || eligible["host-007"] != "true" {
		t.Fatalf("hosts ls after uncordon:\n%s", ls)
	}
	if out := cli("cluster", "remove", "n3"); !strings.Contains(out, "node n3 removed") {
		t.Fatalf("cluster remove: %s", out)
	}
	nodes[2].kill()
	if out := cli("cluster", "members"); strings.Count(out, "\n") != 3 || strings.Contains(out, "n3") {
		t.Fatalf("members after removing n3:\n%s", out)
	}
}

// TestClusterBadInput: each a one-line error, exit status 1, state unchanged.
func TestClusterBadInput(t *testing.T) {
	db := pgtest.New(t)
	solo := newServerNode(t, db, "solo")
	solo.start(t, "--bootstrap")
	agreedLeader(t, 1, solo)
	stranger := newServerNode(t, db, "stranger")
	server := []string{"--server", solo.grpcAddr}

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"join a bad address", append(append([]string{}, stranger.args...), "--join", freeAddr(t), "--join-timeout", "2s",
			"--node-join-token", "corralnode1."+strings.Repeat("x", 43)+"."+strings.Repeat("ab", 32)), "trading the node join token at"},
		{"join without a token", append(append([]string{}, stranger.args...), "--join", solo.raftHTTP), "one-time node join token"},
		{"first start without bootstrap or join", stranger.args, "start the first node with --bootstrap"},
		{"remove the last voter", append([]string{"cluster", "remove", "solo"}, server...), "last voter"},
		{"remove an unknown node", append([]string{"cluster", "remove", "ghost"}, server...), "cluster member ghost"},
		{"drain an unknown host", append([]string{"hosts", "drain", "ghost", "--deadline", "1m"}, server...), "host ghost does not exist"},
		{"cordon an unknown host", append([]string{"hosts", "cordon", "ghost"}, server...), "host ghost does not exist"},
		{"evict a session without a sandbox", append([]string{"sandboxes", "evict", "nope"}, server...), "session nope has no sandbox"},
		{"unreachable admin address", []string{"cluster", "members", "--server", freeAddr(t), "--timeout", "2s"}, "listing members"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, corralBin, tt.args...).CombinedOutput()
			assertOneLineError(t, out, err, tt.want)
		})
	}
	out, err := exec.Command(corralBin, append([]string{"cluster", "members"}, server...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "solo") || strings.Count(strings.TrimSpace(string(out)), "\n") != 1 {
		t.Fatalf("members after the refused removal: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(stranger.dir, "raft.db")); err == nil {
		t.Error("a refused first start left Raft state behind")
	}
}
