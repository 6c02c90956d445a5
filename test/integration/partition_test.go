package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// netns is a network namespace the test created; it is deleted when the
// test ends (taking its end of the veth pair with it).
type netns struct{ name string }

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetns creates a namespace with its loopback up, or skips (fails under
// CI) without root.
func newNetns(t *testing.T, name string) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set, so this test must run: network namespaces need root")
		}
		t.Skip("network namespaces need root; run as root (CI does) to test a partition")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set and the ip command (iproute2) is missing")
		}
		t.Skip("the ip command (iproute2) is not installed")
	}
	ipCmd(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
	return &netns{name: name}
}

// do runs fn on a thread inside the namespace: sockets fn creates stay
// there.
func (ns *netns) do(fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/var/run/netns/" + ns.name)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering %s: %w", ns.name, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread is stuck in the namespace: keep it locked, so it
		// ends with this goroutine instead of serving others.
		return fmt.Errorf("leaving %s: %w", ns.name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// dialer dials addresses inside the namespace, for the test's gRPC clients.
func (ns *netns) dialer() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	})
}

// forward listens on addr inside the namespace and relays each connection
// to the same address in the test's own namespace (PostgreSQL on loopback).
func (ns *netns) forward(t *testing.T, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.do(func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			wg.Go(func() { io.Copy(out, in); out.Close() })
			wg.Go(func() { io.Copy(in, out); in.Close() })
		}
	})
}

// newNetnsNode prepares a node run inside ns, its Raft addresses on ip and
// its API on the namespace's loopback; i keeps ports apart within ns.
func newNetnsNode(t *testing.T, db *pgtest.DB, ns *netns, ip string, i int, id string) *serverNode {
	t.Helper()
	n := &serverNode{id: id, dir: t.TempDir(), grpcAddr: fmt.Sprintf("127.0.0.1:%d", 18100+i),
		raftHTTP: fmt.Sprintf("%s:%d", ip, 18300+i), wrap: []string{"ip", "netns", "exec", ns.name}, key: operatorKey(t, db)}
	n.args = serverArgs(db, id, n.dir, fmt.Sprintf("127.0.0.1:%d", 18000+i), n.grpcAddr, fmt.Sprintf("%s:%d", ip, 18200+i), n.raftHTTP)
	n.dial(t, ns.dialer())
	return n
}

// TestClusterPartition runs two nodes in one network namespace and the third
// in another, joined by a veth pair, and cuts the link: the cut-off node
// cannot commit, the majority carries on, and once the link is back the
// node catches up to the same applied index and placements.
func TestClusterPartition(t *testing.T) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	major, minor := newNetns(t, "crl-a-"+tag), newNetns(t, "crl-b-"+tag)
	vethA, vethB := "crla"+tag, "crlb"+tag
	subnet := fmt.Sprintf("10.%d.%d", 200+int(b[0])%50, b[1])
	ipA, ipB := subnet+".1", subnet+".2"
	ipCmd(t, "link", "add", vethA, "netns", major.name, "type", "veth", "peer", "name", vethB, "netns", minor.name)
	ipCmd(t, "-n", major.name, "addr", "add", ipA+"/24", "dev", vethA)
	ipCmd(t, "-n", minor.name, "addr", "add", ipB+"/24", "dev", vethB)
	ipCmd(t, "-n", major.name, "link", "set", vethA, "up")
	ipCmd(t, "-n", minor.name, "link", "set", vethB, "up")

	db := pgtest.New(t)
	u, err := url.Parse(db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	// Each namespace reaches PostgreSQL through a relay on its own loopback,
	// not through the veth: the cut is between control-plane nodes only.
	major.forward(t, u.Host)
	minor.forward(t, u.Host)

	nodes := []*serverNode{
		newNetnsNode(t, db, major, ipA, 1, "n1"),
		newNetnsNode(t, db, major, ipA, 2, "n2"),
		newNetnsNode(t, db, minor, ipB, 3, "n3"),
	}
	nodes[0].start(t, "--bootstrap")
	agreedLeader(t, 1, nodes[0])
	nodes[1].start(t, joinArgs(t, nodes[0])...)
	nodes[2].start(t, joinArgs(t, nodes[0])...)
	leader := agreedLeader(t, 3, nodes...)
	if leader == nodes[2] {
		t.Fatal("the node to be cut off leads; the test expects the bootstrap node to")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	registerTestHosts(t, ctx, nodes[2], 5)
	place := func(via *serverNode, key string, timeout time.Duration) error {
		cctx, ccancel := context.WithTimeout(ctx, timeout)
		defer ccancel()
		_, err := adminv1.NewSandboxesServiceClient(via.conn).PlaceSandbox(cctx, &adminv1.PlaceSandboxRequest{
			// Ten tenants, each within the default quota's 20 sandboxes.
			Tenant: "t" + key[len(key)-1:], SessionId: key, Resources: &adminv1.Resources{CpuMillis: 100, MemoryMib: 64}})
		return err
	}
	for i := range 50 {
		if err := place(nodes[i%3], fmt.Sprintf("before-%02d", i), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	sameApplied(t, nodes...)

	// Cut the link.
	ipCmd(t, "-n", major.name, "link", "set", vethA, "down")
	err = place(nodes[2], "cut-off", 3*time.Second)
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Fatalf("a write through the cut-off node: %v, want it to time out or be unavailable", err)
	}
	if _, ok := placements(t, nodes[2])["cut-off"]; ok {
		t.Fatal("the cut-off node applied a write on its own")
	}
	majority := nodes[:2]
	agreedLeaderAmong(t, majority)
	for i := range 50 {
		if err := place(majority[i%2], fmt.Sprintf("during-%02d", i), 10*time.Second); err != nil {
			t.Fatalf("the majority stopped committing: %v", err)
		}
	}
	if got := len(placements(t, nodes[2])); got != 50 {
		t.Fatalf("the cut-off node holds %d placements, want the 50 from before the cut", got)
	}

	// Restore it: the node catches up. The write that timed out has an
	// unknown outcome (its forwarded request may still reach the leader
	// when the link returns), so the client asks again with the same
	// session key and gets exactly one placement.
	ipCmd(t, "-n", major.name, "link", "set", vethA, "up")
	if err := place(nodes[2], "cut-off", 30*time.Second); err != nil {
		t.Fatalf("retrying the timed-out write after the link came back: %v", err)
	}
	idx := sameApplied(t, nodes...)
	want := placements(t, nodes[0])
	got := placements(t, nodes[2])
	if len(want) != 101 || len(got) != len(want) {
		t.Fatalf("after the link came back at index %d: %d placements on n1, %d on n3, want 101 each", idx, len(want), len(got))
	}
	for k, w := range want {
		if got[k].GetSandboxId() != w.GetSandboxId() {
			t.Fatalf("%s: n3 has %v, n1 %v", k, got[k], w)
		}
	}
	checkAllocations(t, nodes[2], got)
	t.Logf("cut-off node caught up to index %d", idx)
}

// agreedLeaderAmong waits until the given nodes agree on a leader among
// themselves (the others unreachable).
func agreedLeaderAmong(t *testing.T, nodes []*serverNode) {
	t.Helper()
	waitfor.Cond(t, 30*time.Second, "the majority to agree on a leader among itself", func() bool {
		id := ""
		for _, n := range nodes {
			st, err := n.status(context.Background())
			if err != nil || st.GetLeaderId() == "" || (id != "" && st.GetLeaderId() != id) {
				return false
			}
			id = st.GetLeaderId()
		}
		for _, n := range nodes {
			if n.id == id {
				return true
			}
		}
		return false
	})
}
