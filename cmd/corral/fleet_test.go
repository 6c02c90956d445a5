package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

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
