package server_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// poolsPolicy is a policy directory with the shipped roles, quotas and
// runtimes and placement as its placement.yaml.
func poolsPolicy(t *testing.T, placement string) string {
	t.Helper()
	runtimes, err := os.ReadFile(filepath.Join("..", "..", "policy", "runtimes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := policyDir(t, string(runtimes))
	if err := os.WriteFile(filepath.Join(dir, "placement.yaml"), []byte(placement), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startLabelledHost starts a process-runtime host agent with labels.
func startLabelledHost(t *testing.T, srv *server.Server, id string, labels map[string]string) *process.Driver {
	t.Helper()
	d, _ := startHostWith(t, srv, id, func(c *agent.Config) { c.Labels = labels })
	return d
}

// poolFleet starts hosts shared-a and shared-b (pool shared, zones a and
// b) and dedicated (pool dedicated, zone a), and returns their drivers.
func poolFleet(t *testing.T, srv *server.Server) map[string]*process.Driver {
	t.Helper()
	return map[string]*process.Driver{
		"shared-a":  startLabelledHost(t, srv, "shared-a", map[string]string{"pool": "shared", "zone": "a"}),
		"shared-b":  startLabelledHost(t, srv, "shared-b", map[string]string{"pool": "shared", "zone": "b"}),
		"dedicated": startLabelledHost(t, srv, "dedicated", map[string]string{"pool": "dedicated", "zone": "a"}),
	}
}

// placedOn runs a tool call in a new session of tc and returns the host
// its sandbox went to.
func placedOn(t *testing.T, srv *server.Server, tc *tenantClient, who string) (sessionID, hostID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := tc.newSession(t)
	if out, err := tc.toolTurn(ctx, id, echoOK); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("%s: tool call %q %v", who, out, err)
	}
	host, _, ok := placement(srv, id)
	if !ok {
		t.Fatalf("%s: no placement after a tool call", who)
	}
	return id, host
}

// A fleet of two shared hosts in zones a and b and one host dedicated to
// acme: acme's sessions go to its own host; a tenant that asks for zone
// spread gets its sessions spread over a and b; no other tenant's session
// ever lands on the dedicated host, and when the shared hosts cannot take
// one it is refused with an error naming the pools it may use.
func TestPoolsPlaceEachTenantWhereItMay(t *testing.T) {
	db := pgtest.New(t)
	dir := poolsPolicy(t, `
host_pools:
  shared: {shared: true}
  dedicated: {tenant: tenant_acme}
tenant_placement:
  tenant_acme: {pools: [dedicated, shared]}
  tenant_spread: {spread_zones: true}
`)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", PolicyDir: dir})
	hosts := poolFleet(t, srv)

	acme := newTenantClient(t, srv, "tenant_acme")
	for i := range 2 {
		if _, host := placedOn(t, srv, acme, "acme"); host != "dedicated" {
			t.Fatalf("acme's session %d on %s, want its dedicated host", i, host)
		}
	}
	spread := newTenantClient(t, srv, "tenant_spread")
	zones := map[string]int{}
	for range 4 {
		_, host := placedOn(t, srv, spread, "spread")
		switch host {
		case "shared-a":
			zones["a"]++
		case "shared-b":
			zones["b"]++
		default:
			t.Fatalf("tenant_spread's session on %s", host)
		}
	}
	if zones["a"] != 2 || zones["b"] != 2 {
		t.Fatalf("tenant_spread's 4 sessions by zone: %v, want 2 in a and 2 in b", zones)
	}
	other := newTenantClient(t, srv, "tenant_other")
	for range 3 {
		if _, host := placedOn(t, srv, other, "other"); host == "dedicated" {
			t.Fatal("tenant_other's session landed on acme's dedicated host")
		}
	}

	// Cordon both shared hosts: the dedicated one has room, and still
	// takes no other tenant's session.
	op := servertest.OperatorKey(t, db)
	base := "http://" + srv.HTTPAddr() + "/admin/v1"
	for _, h := range []string{"shared-a", "shared-b"} {
		if code, body := sendAs(t, op, "POST", base+"/hosts/"+h+":cordon", ""); code != 200 {
			t.Fatalf("cordon %s: %d %s", h, code, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	refused := other.newSession(t)
	_, err := other.toolTurn(ctx, refused, echoOK)
	if err == nil || !strings.Contains(err.Error(), "no host in the pools this tenant may use (hosts without a pool, shared)") || strings.Contains(err.Error(), "considered") {
		t.Fatalf("tenant_other's session with the shared hosts cordoned: %v, want a refusal naming its pools, without the fleet's figures", err)
	}
	if _, _, ok := placement(srv, refused); ok {
		t.Fatal("the refused session holds a placement")
	}
	if _, host := placedOn(t, srv, acme, "acme"); host != "dedicated" {
		t.Fatalf("acme's session with the shared hosts cordoned on %s", host)
	}
	if n := sandboxCount(t, hosts["dedicated"]); n != 3 {
		t.Fatalf("%d sandboxes on the dedicated host, want acme's 3", n)
	}
}

// drain drains host through the admin API and returns the messages of its
// progress.
func drain(t *testing.T, srv *server.Server, db *pgtest.DB, host string, deadline time.Duration) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline+time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", servertest.OperatorKey(t, db))
	stream, err := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr())).DrainHost(ctx, &adminv1.DrainHostRequest{HostId: host, Deadline: durationpb.New(deadline)})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return msgs
		}
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
		t.Logf("drain: %s", m.GetMessage())
		msgs = append(msgs, m.GetMessage())
	}
}

// Draining the dedicated host moves acme's session, with its files, only
// to a host its policy lets it use (here a shared one).
func TestDrainDedicatedHostMovesToAllowedHosts(t *testing.T) {
	db := pgtest.New(t)
	dir := poolsPolicy(t, `
host_pools:
  shared: {shared: true}
  dedicated: {tenant: tenant_acme}
  batch: {}
tenant_placement:
  tenant_acme: {pools: [dedicated, shared]}
`)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", PolicyDir: dir})
	poolFleet(t, srv)
	// A host of a pool acme is not bound to: never a target.
	startLabelledHost(t, srv, "batch", map[string]string{"pool": "batch", "zone": "b"})
	acme := newTenantClient(t, srv, "tenant_acme")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := acme.newSession(t)
	if _, err := acme.toolTurn(ctx, id, `!tool bash {"command":"echo kept > f.txt"}`); err != nil {
		t.Fatal(err)
	}
	if host, _, _ := placement(srv, id); host != "dedicated" {
		t.Fatalf("acme's session on %s, want dedicated", host)
	}
	drain(t, srv, db, "dedicated", time.Minute)
	host, _, ok := placement(srv, id)
	if !ok || (host != "shared-a" && host != "shared-b") {
		t.Fatalf("after draining the dedicated host acme's session is on %q (%v), want a shared host", host, ok)
	}
	// (After the drain's note that the sandbox moved with its workspace.)
	if out, err := acme.toolTurn(ctx, id, `!tool bash {"command":"cat f.txt"}`); err != nil || !strings.HasSuffix(strings.TrimSpace(out), "\nkept") {
		t.Fatalf("after the move: %q %v", out, err)
	}
}

// A tenant bound to its dedicated pool alone, whose only dedicated host is
// drained: its session is not moved to a shared host. The drain reports,
// at every attempt, that no host in the tenant's pool fits, and evicts it
// at the deadline; the session's next tool call is refused naming the
// pool, and once another dedicated host joins it runs there.
func TestDrainDedicatedHostWaitsWithoutAnAllowedHost(t *testing.T) {
	db := pgtest.New(t)
	dir := poolsPolicy(t, `
host_pools:
  shared: {shared: true}
  dedicated: {tenant: tenant_acme}
tenant_placement:
  tenant_acme: {pools: [dedicated]}
`)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", PolicyDir: dir})
	hosts := poolFleet(t, srv)
	acme := newTenantClient(t, srv, "tenant_acme")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id, host := placedOn(t, srv, acme, "acme")
	if host != "dedicated" {
		t.Fatalf("acme's session on %s, want dedicated", host)
	}

	msgs := drain(t, srv, db, "dedicated", 2*time.Second)
	retried, evicted := false, false
	for _, m := range msgs {
		if strings.Contains(m, id+": retrying") && strings.Contains(m, "no host in the pools its tenant may use (dedicated)") {
			retried = true
		}
		if strings.Contains(m, id+": evicted") {
			evicted = true
		}
		if strings.Contains(m, " to shared-") {
			t.Fatalf("the drain moved acme's session to a shared host: %s", m)
		}
	}
	if !retried || !evicted {
		t.Fatalf("drain messages %q: want retries naming the pool, then the eviction at the deadline", msgs)
	}
	for _, h := range []string{"shared-a", "shared-b"} {
		if n := sandboxCount(t, hosts[h]); n != 0 {
			t.Fatalf("%d sandboxes on %s", n, h)
		}
	}

	_, err := acme.toolTurn(ctx, id, echoOK)
	if err == nil || !strings.Contains(err.Error(), "no host in the pools this tenant may use (dedicated)") {
		t.Fatalf("acme's tool call with its only dedicated host drained: %v, want a refusal naming the pool", err)
	}
	if _, _, ok := placement(srv, id); ok {
		t.Fatal("the refused session holds a placement")
	}

	startLabelledHost(t, srv, "dedicated-2", map[string]string{"pool": "dedicated", "zone": "b"})
	if out, err := acme.toolTurn(ctx, id, echoOK); err != nil || !strings.Contains(out, "ok") {
		t.Fatalf("acme's tool call once another dedicated host joined: %q %v", out, err)
	}
	if host, _, _ := placement(srv, id); host != "dedicated-2" {
		t.Fatalf("acme's session on %s, want dedicated-2", host)
	}
}

// A host lost with another tenant's session: the session is rescheduled to
// the other shared host, never to acme's dedicated host, though that one
// is as empty and sorts first.
func TestHostLossReschedulesWithinThePools(t *testing.T) {
	db := pgtest.New(t)
	dir := poolsPolicy(t, `
host_pools:
  shared: {shared: true}
  dedicated: {tenant: tenant_acme}
`)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process", PolicyDir: dir,
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: time.Second})
	_, stopA := startHostWith(t, srv, "shared-a", func(c *agent.Config) { c.Labels = map[string]string{"pool": "shared", "zone": "a"} })
	other := newTenantClient(t, srv, "tenant_other")
	id, host := placedOn(t, srv, other, "other")
	if host != "shared-a" {
		t.Fatalf("tenant_other's session on %s, want shared-a", host)
	}
	startLabelledHost(t, srv, "dedicated", map[string]string{"pool": "dedicated", "zone": "a"})
	startLabelledHost(t, srv, "shared-b", map[string]string{"pool": "shared", "zone": "b"})
	stopA()
	waitfor.Cond(t, 30*time.Second, "the sandbox to be rescheduled off shared-a", func() bool {
		h, _, _ := placement(srv, id)
		return h != "shared-a"
	})
	if h, _, _ := placement(srv, id); h != "shared-b" {
		t.Fatalf("tenant_other's session rescheduled to %s, want shared-b", h)
	}
}
