package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/logging"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
	"corral.dev/corral/test/fleettest"
)

// fakeOps records drains and evictions and reports scripted progress.
type fakeOps struct {
	drained, evicted []string
}

func (f *fakeOps) StartDrain(_ context.Context, hostID string, o fleet.DrainOptions) (raftfsm.Drain, error) {
	f.drained = append(f.drained, fmt.Sprintf("%s/%v/%d", hostID, o.Deadline, o.MaxParallel))
	return raftfsm.Drain{HostID: hostID, Total: 2}, nil
}

// WatchDrain reports a drain of two sandboxes in two changes: s1 moved,
// then s2 evicted and the drain finished; or, until ctx ends, the first
// only, when the call detaches.
func (f *fakeOps) WatchDrain(ctx context.Context, hostID string, _ int, fn func(raftfsm.Drain, []raftfsm.DrainStep)) error {
	d := raftfsm.Drain{HostID: hostID, Total: 2, Moved: 1, MaxParallel: 4}
	fn(d, []raftfsm.DrainStep{{Seq: 1, SessionID: "s1", State: "moved", To: "h2", Message: "s1: moved to h2"}})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	d.Evicted, d.Finished = 1, time.Now()
	fn(d, []raftfsm.DrainStep{{Seq: 2, SessionID: "s2", State: "evicted", Message: "s2: evicted"}})
	return nil
}

func (f *fakeOps) Evict(_ context.Context, key string) error {
	f.evicted = append(f.evicted, key)
	return nil
}

// fleetSetup serves the admin services of a one-node Raft cluster over
// loopback gRPC, with ops as HostOps (nil: none).
func fleetSetup(t *testing.T, ops HostOps) (adminv1.HostsServiceClient, adminv1.SandboxesServiceClient, adminv1.ClusterServiceClient) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipped because it starts a raft node on loopback")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	node, err := raftfsm.Start(ctx, raftfsm.Config{
		ID: "n1", RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(), Bootstrap: true,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaderLeaseTimeout: 150 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Shutdown() })
	// Without the security interceptors: this tests the services; the
	// route walk in controlplane/server tests who may call them.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unaryInterceptor(logging.Discard())), grpc.ChainStreamInterceptor(streamInterceptor(logging.Discard())))
	hostSvc, err := hosts.New(ctx, hosts.Config{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	sessions := fleettest.NewSessions()
	fl, err := fleet.New(fleet.Config{Cluster: node, Credentials: hostSvc.SandboxCredentials,
		Request: scheduler.Request{Runtime: "gvisor"}, Sessions: sessions, Notices: sessions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Close)
	hs := &HostsService{Fleet: node, Hosts: hostSvc}
	if ops != nil {
		hs.Ops = ops
	}
	adminv1.RegisterHostsServiceServer(srv, hs)
	adminv1.RegisterSandboxesServiceServer(srv, &SandboxesService{Fleet: node, Sandboxes: fl})
	adminv1.RegisterClusterServiceServer(srv, &ClusterService{NodeID: "n1", Raft: node})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hosts := adminv1.NewHostsServiceClient(conn)
	if _, err := hosts.RegisterHost(ctx, &adminv1.RegisterHostRequest{Host: &adminv1.Host{
		Id: "h1", Runtimes: []string{"runsc"}, Capacity: &adminv1.Resources{CpuMillis: 4000, MemoryMib: 8192, DiskMib: 10000},
	}}); err != nil {
		t.Fatal(err)
	}
	return hosts, adminv1.NewSandboxesServiceClient(conn), adminv1.NewClusterServiceClient(conn)
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v, want %v", what, err, code)
	}
}

func TestFleetServices(t *testing.T) {
	ops := &fakeOps{}
	hosts, sandboxes, cluster := fleetSetup(t, ops)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	req := &adminv1.PlaceSandboxRequest{Tenant: "t1", SessionId: "s1", Runtime: "runsc", Resources: &adminv1.Resources{CpuMillis: 1000, MemoryMib: 1024}}
	first, err := sandboxes.PlaceSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := sandboxes.PlaceSandbox(ctx, req)
	if err != nil || again.GetSandbox().GetSandboxId() != first.GetSandbox().GetSandboxId() || first.GetSandbox().GetHostId() != "h1" {
		t.Fatalf("placing twice: %v then %v (%v)", first, again, err)
	}
	_, err = sandboxes.PlaceSandbox(ctx, &adminv1.PlaceSandboxRequest{Tenant: "t1", SessionId: "big", Resources: &adminv1.Resources{CpuMillis: 99000}})
	wantCode(t, "placing what fits nowhere", err, codes.ResourceExhausted)
	_, err = sandboxes.PlaceSandbox(ctx, &adminv1.PlaceSandboxRequest{SessionId: "x"})
	wantCode(t, "placing without a tenant", err, codes.InvalidArgument)

	// One session's placement, with what the host runs it with; no runner
	// is assigned (no loop ever ran it).
	one, err := sandboxes.ListSandboxes(ctx, &adminv1.ListSandboxesRequest{SessionId: "s1"})
	if err != nil || len(one.GetSandboxes()) != 1 || one.GetSandboxes()[0].GetSessionId() != "s1" || one.GetSandboxes()[0].GetRuntime() != "runsc" || one.GetRunnerNodeId() != "" {
		t.Fatalf("sandboxes of s1: %v %v", one, err)
	}
	if none, err := sandboxes.ListSandboxes(ctx, &adminv1.ListSandboxesRequest{SessionId: "nope"}); err != nil || len(none.GetSandboxes()) != 0 {
		t.Fatalf("sandboxes of a session without one: %v %v", none, err)
	}

	list, err := hosts.ListHosts(ctx, &adminv1.ListHostsRequest{})
	if err != nil || len(list.GetHosts()) != 1 || list.GetHosts()[0].GetSandboxes() != 1 || list.GetHosts()[0].GetAllocated().GetCpuMillis() != 1000 {
		t.Fatalf("hosts: %v %v", list, err)
	}

	c, err := hosts.CordonHost(ctx, &adminv1.CordonHostRequest{HostId: "h1"})
	if err != nil || c.GetHost().GetEligible() {
		t.Fatalf("cordon: %v %v", c, err)
	}
	_, err = sandboxes.PlaceSandbox(ctx, &adminv1.PlaceSandboxRequest{Tenant: "t1", SessionId: "s2", Resources: &adminv1.Resources{CpuMillis: 100}})
	wantCode(t, "placing on a cordoned fleet", err, codes.ResourceExhausted)
	u, err := hosts.UncordonHost(ctx, &adminv1.UncordonHostRequest{HostId: "h1"})
	if err != nil || !u.GetHost().GetEligible() {
		t.Fatalf("uncordon: %v %v", u, err)
	}
	_, err = hosts.CordonHost(ctx, &adminv1.CordonHostRequest{HostId: "ghost"})
	wantCode(t, "cordoning an unknown host", err, codes.NotFound)

	// Drain streams the progress HostOps reports, then a final message.
	stream, err := hosts.DrainHost(ctx, &adminv1.DrainHostRequest{HostId: "h1", Deadline: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var got []*adminv1.DrainHostResponse
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	if len(got) != 3 || got[0].GetMoved() != 1 || got[0].GetRemaining() != 1 || got[0].GetMessage() != "s1: moved to h2" ||
		got[1].GetEvicted() != 1 || got[1].GetRemaining() != 0 || !got[2].GetDone() || got[2].GetTotal() != 2 ||
		len(ops.drained) != 1 || ops.drained[0] != "h1/1m0s/0" {
		t.Fatalf("drain progress %v, drained %v", got, ops.drained)
	}
	// Detached, the call returns after its first message; the drain is
	// the fleet's to run.
	stream, err = hosts.DrainHost(ctx, &adminv1.DrainHostRequest{HostId: "h1", MaxParallel: 8, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	if len(got) != 1 || got[0].GetDone() || len(ops.drained) != 2 || ops.drained[1] != "h1/10m0s/8" {
		t.Fatalf("detached drain: %v, drained %v", got, ops.drained)
	}
	// watch starts nothing, and takes no options.
	stream, err = hosts.DrainHost(ctx, &adminv1.DrainHostRequest{HostId: "h1", Watch: true, MaxParallel: 2})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "watch with options", err, codes.InvalidArgument)
	stream, err = hosts.DrainHost(ctx, &adminv1.DrainHostRequest{HostId: "ghost"})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "draining an unknown host", err, codes.NotFound)

	if _, err := hosts.EvictSandbox(ctx, &adminv1.EvictSandboxRequest{SessionId: "s1"}); err != nil || len(ops.evicted) != 1 {
		t.Fatalf("evict: %v %v", err, ops.evicted)
	}
	_, err = hosts.EvictSandbox(ctx, &adminv1.EvictSandboxRequest{SessionId: "nope"})
	wantCode(t, "evicting a session without a sandbox", err, codes.NotFound)

	rel, err := sandboxes.ReleaseSandbox(ctx, &adminv1.ReleaseSandboxRequest{SessionId: "s1"})
	if err != nil || rel.GetSandbox().GetSessionId() != "s1" {
		t.Fatalf("release: %v %v", rel, err)
	}
	_, err = sandboxes.ReleaseSandbox(ctx, &adminv1.ReleaseSandboxRequest{SessionId: "s1"})
	wantCode(t, "releasing twice", err, codes.NotFound)
	if l, err := sandboxes.ListSandboxes(ctx, &adminv1.ListSandboxesRequest{}); err != nil || len(l.GetSandboxes()) != 0 {
		t.Fatalf("sandboxes after release: %v %v", l, err)
	}

	// Membership: the last voter stays, an unknown node is not found.
	_, err = cluster.RemoveMember(ctx, &adminv1.RemoveMemberRequest{NodeId: "n1"})
	wantCode(t, "removing the last voter", err, codes.FailedPrecondition)
	_, err = cluster.RemoveMember(ctx, &adminv1.RemoveMemberRequest{NodeId: "ghost"})
	wantCode(t, "removing an unknown node", err, codes.NotFound)
	m, err := cluster.ListMembers(ctx, &adminv1.ListMembersRequest{})
	if err != nil || len(m.GetMembers()) != 1 || !m.GetMembers()[0].GetLeader() || m.GetLeaderId() != "n1" {
		t.Fatalf("members: %v %v", m, err)
	}
}

func TestHostOpsUnimplementedWithoutOps(t *testing.T) {
	hosts, _, _ := fleetSetup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := hosts.DrainHost(ctx, &adminv1.DrainHostRequest{HostId: "h1"})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "drain without HostOps", err, codes.Unimplemented)
	_, err = hosts.EvictSandbox(ctx, &adminv1.EvictSandboxRequest{SessionId: "none"})
	wantCode(t, "evict of an unknown session without HostOps", err, codes.NotFound)
}
