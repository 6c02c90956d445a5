package hosts_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
	"corral.dev/corral/test/fleettest"
)

// join builds (and so joins) a host agent with token that knows the nodes
// listed.
func join(t *testing.T, c *fleettest.Cluster, id string, token logging.Secret, nodes ...int) error {
	t.Helper()
	d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, i := range nodes {
		addrs = append(addrs, c.HostAddr(i))
	}
	_, err = agent.New(context.Background(), agent.Config{
		HostID: id, ControlPlane: strings.Join(addrs, ","), JoinToken: token, StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: "process",
	})
	return err
}

func TestJoinConnectAndEnsure(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	// A wrong token is refused, and the host is not known afterwards.
	tok, err := hostpki.ParseJoinToken(c.Token().Reveal())
	if err != nil {
		t.Fatal(err)
	}
	bad := hostpki.JoinToken{Secret: "not-the-secret", CAPin: tok.CAPin}
	if err := join(t, c, "h-bad", logging.Secret(bad.Reveal()), 0, 1, 2); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("joining with a wrong token: %v, want unauthenticated", err)
	}
	// A token works once, across the cluster: used through one node, it is
	// refused through another.
	good := c.Token()
	if err := join(t, c, "h-once", good, 0); err != nil {
		t.Fatal(err)
	}
	if err := join(t, c, "h-twice", good, 1); errdefs.KindOf(err) != errdefs.UnauthenticatedKind || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("joining with a used token: %v", err)
	}

	// The agent lists followers first: they refuse its stream and it finds
	// the leader.
	c.StartHost("h1", fleettest.HostOptions{})
	l := c.Leader()
	h := c.HostRecord(l, "h1")
	if h.Status != scheduler.StatusReady || !h.Eligible || h.Address == "" || h.Capacity.CPUMillis != 4000 || h.Runtimes[0] != "process" {
		t.Fatalf("registered host %+v", h)
	}
	for i := range 3 {
		if i != l && c.Hosts(i).Connected("h1") {
			t.Fatalf("follower n%d holds h1's stream", i+1)
		}
	}
	// A placement becomes a sandbox on the host, and the host's report of
	// it becomes the placement's readiness in every node's state.
	f := c.Follower()
	ctx, cancel := context.WithTimeout(c.Ctx(), time.Minute)
	defer cancel()
	p, err := c.Fleet(f).Place(ctx, scheduler.Request{SessionID: "s1", Tenant: "t1", Runtime: "process", Resources: scheduler.Resources{CPUMillis: 500}})
	if err != nil || p.HostID != "h1" || p.Ready {
		t.Fatalf("placed %+v, %v", p, err)
	}
	for i := range 3 {
		if err := c.Node(i).Wait(ctx, func(v raftfsm.View) bool { p, _ := v.Placement("s1"); return p.Ready }); err != nil {
			t.Fatalf("s1 ready on n%d: %v", i+1, err)
		}
	}
	if _, err := c.SandboxClient("h1").WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "notes.txt", Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile("h1", "s1", "notes.txt"); err != nil || got != "hello" {
		t.Fatalf("read back %q, %v", got, err)
	}
	// Released, it is destroyed on the host.
	if _, err := c.Fleet(f).Release(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	waitfor.Cond(t, 10*time.Second, "the released sandbox to go", func() bool {
		_, err := c.ReadFile("h1", "s1", "notes.txt")
		return errdefs.IsNotFound(err)
	})
}

func TestLeaderFailoverKeepsHostsUp(t *testing.T) {
	o := fleettest.Options{Nodes: 3}
	c := fleettest.Start(t, o)
	c.StartHost("h1", fleettest.HostOptions{})
	c.StartHost("h2", fleettest.HostOptions{})
	c.Sandbox(c.Follower(), "sesn_1")
	old := c.Leader()
	killed := time.Now()
	c.Kill(old)
	l := c.Leader()
	c.WaitConnected("h1")
	c.WaitConnected("h2")
	t.Logf("new leader n%d; hosts reconnected %v after the kill", l+1, time.Since(killed).Round(time.Millisecond))
	// Through the grace period and a TTL beyond, both stay up: they
	// heartbeat to the new leader.
	end := time.Now().Add(3*time.Second + 2*time.Second)
	for time.Now().Before(end) {
		for _, id := range []string{"h1", "h2"} {
			if h := c.HostRecord(l, id); h.Status != scheduler.StatusReady {
				t.Fatalf("host %s marked %s after the leader change", id, h.Status)
			}
		}
		time.Sleep(50 * time.Millisecond) // sampling the status over a period
	}
	if p, _ := c.Placement(l, "sesn_1"); p.HostID != "h1" {
		t.Fatalf("sesn_1 moved to %s", p.HostID)
	}
	// The new leader still drives the hosts: a new placement is ensured.
	c.Sandbox(l, "sesn_2")
}

func TestSilentHostIsMarkedDown(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	h1 := c.StartHost("h1", fleettest.HostOptions{})
	stopped := time.Now()
	h1.Stop()
	l := c.Leader()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Node(l).Wait(ctx, func(v raftfsm.View) bool {
		h, _ := v.Host("h1")
		return h.Status == scheduler.StatusDown
	}); err != nil {
		t.Fatalf("h1 marked down: %v", err)
	}
	if took := time.Since(stopped); took < 2*time.Second {
		t.Fatalf("marked down %v after the host stopped, before the TTL", took)
	}
}

func TestFollowerRefusesConnectNamingTheLeader(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	l := c.Leader()
	f := c.Follower()
	key, csr, err := hostpki.NewKeyAndCSR("h9")
	if err != nil {
		t.Fatal(err)
	}
	ca := c.Hosts(f).CA()
	der, err := ca.SignHost(csr, "h9", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	conn, err := grpc.NewClient(c.HostAddr(f), grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(ca.Cert, &cert, hostpki.ControlPlaneName))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := pb.NewHostServiceClient(conn).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Register{Register: &pb.Register{HostId: "h9"}}})
	_, err = st.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Connect on a follower: %v, want Unavailable", err)
	}
	if got := st.Trailer().Get(hostpki.LeaderMetadataKey); len(got) != 1 || got[0] != c.HostAddr(l) {
		t.Fatalf("leader hint %v, want %s (error %v)", got, c.HostAddr(l), err)
	}
	if h := c.HostRecord(l, "h9"); h.ID != "" {
		t.Fatalf("a follower registered the host: %+v", h)
	}
}
