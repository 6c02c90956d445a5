package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// fakeCluster answers ListMembers and records the API key it was sent.
type fakeCluster struct {
	adminv1.UnimplementedClusterServiceServer
	keys []string
}

func (f *fakeCluster) ListMembers(ctx context.Context, _ *adminv1.ListMembersRequest) (*adminv1.ListMembersResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.keys = append(f.keys, md.Get("x-api-key")...)
	return &adminv1.ListMembersResponse{LeaderId: "n1", Members: []*adminv1.Member{
		{NodeId: "n1", RaftAddr: "10.0.0.1:8300", RaftHttpAddr: "10.0.0.1:8301", Voter: true, Leader: true},
		{NodeId: "n2", RaftAddr: "10.0.0.2:8300", Voter: true},
	}}, nil
}

// The operator verbs send the key from CORRAL_OPERATOR_KEY as x-api-key
// metadata, so the admin API can authenticate them without a CLI change.
func TestOperatorVerbsSendTheAPIKey(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fake := &fakeCluster{}
	adminv1.RegisterClusterServiceServer(srv, fake)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	t.Setenv("CORRAL_OPERATOR_KEY", "crl_operator_secret")
	t.Setenv("CORRAL_ADMIN_ADDR", ln.Addr().String())
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"cluster", "members"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(fake.keys) != 1 || fake.keys[0] != "crl_operator_secret" {
		t.Fatalf("x-api-key sent: %v", fake.keys)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "n1") || !strings.Contains(lines[1], "true") || !strings.HasPrefix(lines[2], "n2") {
		t.Fatalf("output:\n%s", out.String())
	}

	// An unimplemented verb is one error naming what failed.
	root = newRootCommand()
	root.SetArgs([]string{"cluster", "remove", "n2"})
	if err := root.ExecuteContext(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "removing n2: ") {
		t.Fatalf("remove against a server without it: %v", err)
	}
}

// corral hosts drain against a real control plane and two real (process)
// hosts: --detach returns once the drain has started and says how to
// follow it; --watch follows it to its end; the session's sandbox is then
// on the other host, its workspace with it.
func TestHostsDrainDetachAndWatch(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	startProcessHost(t, srv, "h1")
	a := api{t: t, base: "http://" + srv.HTTPAddr(), key: servertest.TenantKey(t, srv, tenant.Default)}
	t.Setenv("CORRAL_GRPC_ADDR", srv.GRPCAddr())
	t.Setenv("CORRAL_OPERATOR_KEY", servertest.OperatorKey(t, db))

	agentID := a.id("POST", "/v1/agents", map[string]any{"name": "drain-agent", "model": "fake", "tools": []any{map[string]any{
		"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}},
	}}})
	envID := a.id("POST", "/v1/environments", map[string]any{"name": "drain-env"})
	id := a.id("POST", "/v1/sessions", map[string]any{"agent": agentID, "environment_id": envID})
	t.Setenv("CORRAL_URL", a.base)
	t.Setenv("CORRAL_API_KEY", a.key)
	// sessions tail follows the turns, so the test waits on their events.
	ctx, cancel := context.WithCancel(context.Background())
	tailLines, tailStatus, tailDone := runTail(ctx, id)
	t.Cleanup(func() { cancel(); <-tailDone })
	waitLine(t, tailStatus, "tail", "following session "+id)
	turn := func(command, want string) {
		t.Helper()
		a.call("POST", "/v1/sessions/"+id+"/events", map[string]any{"events": []any{
			map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": `!tool bash {"command":"` + command + `"}`}}},
		}})
		if l := waitLine(t, tailLines, "tail", "agent.tool_result"); !strings.Contains(l, want) {
			t.Fatalf("the tool result of %q: %s", command, l)
		}
		waitLine(t, tailLines, "tail", "session.status_idle")
	}
	turn("echo kept > f; echo written", "written")
	if ls := mustCLI(t, "sandboxes", "ls"); !strings.Contains(ls, "h1") {
		t.Fatalf("sandboxes before the drain:\n%s", ls)
	}
	startProcessHost(t, srv, "h2")

	out := mustCLI(t, "hosts", "drain", "h1", "--detach", "--max-parallel", "2", "--deadline", "2m")
	if !strings.Contains(out, "the drain of h1 goes on; follow it with: corral hosts drain h1 --watch") {
		t.Fatalf("hosts drain --detach:\n%s", out)
	}
	if _, err := cli(t, "hosts", "drain", "h1", "--watch", "--deadline", "1m"); err == nil || !strings.Contains(err.Error(), "--watch follows a running drain") {
		t.Fatalf("--watch with --deadline: %v", err)
	}
	out = mustCLI(t, "hosts", "drain", "h1", "--watch")
	if !strings.Contains(out, "drained h1: 1 moved (0 live), 0 evicted") {
		t.Fatalf("hosts drain --watch:\n%s", out)
	}
	if ls := mustCLI(t, "sandboxes", "ls"); !strings.Contains(ls, "h2") || strings.Contains(ls, "h1") {
		t.Fatalf("sandboxes after the drain:\n%s", ls)
	}
	// Its workspace moved with it: the next turn, told of the move, reads
	// the file on h2.
	turn("cat f", "was moved to another host (its host was drained) with its workspace")
	if evs := mustCLI(t, "sessions", "events", id, "-o", "json", "--page-size", "50"); !strings.Contains(evs, `with its workspace: the files under /workspace are as they were, but processes that were running (background jobs, servers) and files outside /workspace, such as in /tmp, are gone.\n\nkept"`) {
		t.Fatalf("the file did not move with the sandbox:\n%s", evs)
	}
}
