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

	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

func TestJoinConnectAndEnsure(t *testing.T) {
	c := setup(t)
	// A wrong token is refused, and the host is not known afterwards.
	tok, err := hostpki.ParseJoinToken(c.token().Reveal())
	if err != nil {
		t.Fatal(err)
	}
	bad := hostpki.JoinToken{Secret: "not-the-secret", CAPin: tok.CAPin}
	if _, err := c.newAgent("h-bad", logging.Secret(bad.Reveal()), 0, 1, 2); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("joining with a wrong token: %v, want unauthenticated", err)
	}
	// A token works once, across the cluster: used through one node, it is
	// refused through another.
	good := c.token()
	if _, err := c.newAgent("h-once", good, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.newAgent("h-twice", good, 1); errdefs.KindOf(err) != errdefs.UnauthenticatedKind || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("joining with a used token: %v", err)
	}

	// The agent lists followers first: they refuse its stream and it finds
	// the leader.
	c.startHost("h1")
	h := c.host("h1")
	if h.Status != scheduler.StatusReady || !h.Eligible || h.Address == "" || h.Capacity.CPUMillis != 4000 || h.Runtimes[0] != "process" {
		t.Fatalf("registered host %+v", h)
	}
	for i, s := range c.svcs {
		if i != c.leader() && s.Connected("h1") {
			t.Fatalf("follower n%d holds h1's stream", i+1)
		}
	}
	// A placement becomes a sandbox on the host, usable from any node.
	p := c.place("s1")
	if p.HostID != "h1" {
		t.Fatalf("placed on %s", p.HostID)
	}
	c.writeFile("h1", "s1", "notes.txt", "hello")
	if got, err := c.readFile("h1", "s1", "notes.txt"); err != nil || got != "hello" {
		t.Fatalf("read back %q, %v", got, err)
	}
	// Released, it is destroyed on the host.
	if err := c.any().Evict(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	waitfor.Cond(t, 30*time.Second, "the released sandbox to go", func() bool {
		_, err := c.readFile("h1", "s1", "notes.txt")
		return errdefs.IsNotFound(err)
	})
	if err := c.any().Evict(context.Background(), "s1"); !errdefs.IsNotFound(err) {
		t.Fatalf("evicting twice: %v", err)
	}
}

func TestLeaderFailoverKeepsHostsUp(t *testing.T) {
	c := setup(t)
	c.startHost("h1")
	c.startHost("h2")
	c.place("s1")
	old := c.leader()
	killed := time.Now()
	c.kill(old)
	l := c.leader()
	c.waitConnected("h1")
	c.waitConnected("h2")
	t.Logf("new leader n%d; hosts reconnected %v after the kill", l+1, time.Since(killed).Round(time.Millisecond))
	// Through the grace period and a TTL beyond, both stay up: they
	// heartbeat to the new leader.
	end := time.Now().Add(grace + hostTTL)
	for time.Now().Before(end) {
		for _, id := range []string{"h1", "h2"} {
			if h := c.host(id); h.Status != scheduler.StatusReady {
				t.Fatalf("host %s marked %s after the leader change", id, h.Status)
			}
		}
		time.Sleep(50 * time.Millisecond) // sampling the status over a period
	}
	if p := c.placement("s1"); p.HostID != "h1" {
		t.Fatalf("s1 moved to %s", p.HostID)
	}
	// The new leader still drives the hosts: a new placement is ensured.
	c.place("s2")
}

func TestHostLossReschedules(t *testing.T) {
	c := setup(t)
	h1 := c.startHost("h1")
	c.startHost("h2")
	c.place("s1")
	c.place("s2")
	if c.placement("s1").HostID != "h1" || c.placement("s2").HostID != "h1" {
		t.Fatal("expected both sessions on h1")
	}
	stopped := time.Now()
	h1.stop()
	got := map[string]rescheduled{}
	for len(got) < 2 {
		select {
		case r := <-c.moved:
			got[r.key] = r
		case <-time.After(20 * time.Second):
			t.Fatalf("rescheduled: %v", got)
		}
	}
	took := time.Since(stopped)
	if took < hostTTL {
		t.Fatalf("rescheduled %v after the host stopped, before the TTL %v", took, hostTTL)
	}
	t.Logf("host down and sessions rescheduled %v after the agent stopped (TTL %v)", took.Round(time.Millisecond), hostTTL)
	for _, k := range []string{"s1", "s2"} {
		if r := got[k]; r != (rescheduled{"t1", k, "h1", "h2"}) {
			t.Fatalf("hook %+v", r)
		}
		if p, err := c.any().WaitReady(context.Background(), k); err != nil || p.HostID != "h2" {
			t.Fatalf("%s after loss: %+v %v", k, p, err)
		}
	}
	if h := c.host("h1"); h.Status != scheduler.StatusDown {
		t.Fatalf("h1 is %s", h.Status)
	}
}

func TestDrainMovesWorkspaces(t *testing.T) {
	c := setup(t)
	c.startHost("h1")
	c.startHost("h2")
	keys := []string{"s1", "s2", "s3"}
	for _, k := range keys {
		c.place(k)
		c.writeFile("h1", k, "dir/state.txt", "state of "+k)
	}
	var steps []hosts.DrainProgress
	err := c.any().Drain(context.Background(), "h1", time.Minute, func(p hosts.DrainProgress) { steps = append(steps, p) })
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 || steps[2].Done != 3 || steps[2].Total != 3 {
		t.Fatalf("progress %+v", steps)
	}
	for _, st := range steps {
		if st.State != hosts.DrainMoved || st.To != "h2" || st.Err != nil {
			t.Fatalf("step %+v", st)
		}
	}
	for _, k := range keys {
		if p := c.placement(k); p.HostID != "h2" {
			t.Fatalf("%s on %s", k, p.HostID)
		}
		if got, err := c.readFile("h2", k, "dir/state.txt"); err != nil || got != "state of "+k {
			t.Fatalf("%s on h2: %q, %v", k, got, err)
		}
	}
	if h := c.host("h1"); h.Eligible || !h.Draining {
		t.Fatalf("drained host %+v", h)
	}
	waitfor.Cond(t, 30*time.Second, "the old sandboxes to go", func() bool {
		_, err := c.readFile("h1", "s1", "dir/state.txt")
		return errdefs.IsNotFound(err)
	})
}

func TestDrainUnknownHost(t *testing.T) {
	c := setup(t)
	c.startHost("h1")
	err := c.any().Drain(context.Background(), "nope", time.Minute, nil)
	if !errdefs.IsNotFound(err) {
		t.Fatalf("draining an unknown host: %v", err)
	}
	c.node().Read(func(v raftfsm.View) {
		if _, ok := v.Host("nope"); ok || len(v.Hosts()) != 1 {
			t.Fatal("state changed")
		}
	})
	if err := c.any().Drain(context.Background(), "h1", 0, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("zero deadline: %v", err)
	}
}

func TestDrainDeadlineEvicts(t *testing.T) {
	c := setup(t)
	c.startHost("h1")
	c.startHost("h2")
	c.place("busy")
	c.place("idle")
	svc := c.any()
	// A tool call in progress on "busy" holds its lock past the deadline.
	unlock, err := svc.LockSandbox(context.Background(), "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	var steps []hosts.DrainProgress
	if err := svc.Drain(context.Background(), "h1", 3*time.Second, func(p hosts.DrainProgress) { steps = append(steps, p) }); err != nil {
		t.Fatal(err)
	}
	states := map[string]hosts.DrainState{}
	for _, st := range steps {
		states[st.SessionKey] = st.State
	}
	if states["idle"] != hosts.DrainMoved || states["busy"] != hosts.DrainEvicted {
		t.Fatalf("progress %+v", steps)
	}
	if p := c.placement("busy"); p.HostID != "" {
		t.Fatalf("evicted session still placed: %+v", p)
	}
	if p := c.placement("idle"); p.HostID != "h2" {
		t.Fatalf("idle on %q", p.HostID)
	}
}

func TestFollowerRefusesConnectNamingTheLeader(t *testing.T) {
	c := setup(t)
	l := c.leader()
	f := (l + 1) % 3
	key, csr, err := hostpki.NewKeyAndCSR("h9")
	if err != nil {
		t.Fatal(err)
	}
	der, err := c.svcs[f].CA().SignHost(csr, "h9", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	conn, err := grpc.NewClient(c.addrs[f], grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(c.svcs[f].CA().Cert, &cert, hostpki.ControlPlaneName))))
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
	if got := st.Trailer().Get(hostpki.LeaderMetadataKey); len(got) != 1 || got[0] != c.addrs[l] {
		t.Fatalf("leader hint %v, want %s (error %v)", got, c.addrs[l], err)
	}
	if h := c.host("h9"); h.ID != "" {
		t.Fatalf("a follower registered the host: %+v", h)
	}
}
