package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// fakeHosts answers ListHosts with one healthy and one sick host.
type fakeHosts struct {
	adminv1.UnimplementedHostsServiceServer
}

func (fakeHosts) ListHosts(context.Context, *adminv1.ListHostsRequest) (*adminv1.ListHostsResponse, error) {
	since := timestamppb.New(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	return &adminv1.ListHostsResponse{Hosts: []*adminv1.Host{
		{Id: "host-a", Status: "ready", Eligible: true, Runtimes: []string{"gvisor"}, Providers: []string{"gvisor"},
			ProviderDetails:      []*adminv1.HostProvider{{Name: "gvisor", Platform: "systrap", Healthy: false, Reason: "canary: runsc --version: exit status 1", Since: since}},
			Conditions:           []*adminv1.HostCondition{{Type: "memory_pressure", Ok: false, Reason: "under pressure", Since: since}, {Type: "disk_pressure", Ok: true}},
			UnschedulableReasons: []string{"memory_pressure: under pressure", "provider gvisor: ..."}},
		{Id: "host-b", Status: "ready", Eligible: true, Schedulable: true, Runtimes: []string{"gvisor"},
			ProviderDetails: []*adminv1.HostProvider{{Name: "gvisor", Platform: "systrap", Healthy: true}}},
	}}, nil
}

// corral hosts ls shows providers and whether a host takes placements,
// then why not, with since when.
func TestHostsLsSaysWhy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	adminv1.RegisterHostsServiceServer(srv, fakeHosts{})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	t.Setenv("CORRAL_OPERATOR_KEY", "crl_operator_secret")
	t.Setenv("CORRAL_ADMIN_ADDR", ln.Addr().String())
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"hosts", "ls"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 ||
		!strings.Contains(lines[0], "PROVIDERS") || !strings.Contains(lines[0], "PLACEMENTS") ||
		!strings.Contains(lines[1], "gvisor(systrap):failing") || !strings.HasSuffix(lines[1], "no") ||
		!strings.Contains(lines[2], "gvisor(systrap):ok") || !strings.HasSuffix(lines[2], "yes") ||
		lines[3] != "host-a: condition memory_pressure: under pressure (since 2026-05-01T12:00:00Z)" ||
		lines[4] != "host-a: provider gvisor: canary: runsc --version: exit status 1 (since 2026-05-01T12:00:00Z)" {
		t.Fatalf("hosts ls:\n%s", out.String())
	}
}
