package hosts_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/hostpki"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
	"corral.dev/corral/test/fleettest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// rawHost is a host the test speaks for, message by message: a host that
// may lie.
type rawHost struct {
	t    *testing.T
	st   pb.HostService_ConnectClient
	reg  *pb.Registered
	acks chan uint64
}

// connectRaw joins id with a certificate from the leader's CA and
// registers it with the process runtime.
func connectRaw(t *testing.T, c *fleettest.Cluster, id string) *rawHost {
	t.Helper()
	l := c.Leader()
	key, csr, err := hostpki.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	ca := c.Hosts(l).CA()
	der, err := ca.SignHost(csr, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	conn, err := grpc.NewClient(c.HostAddr(l), grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(ca.Cert, &cert, hostpki.ControlPlaneName))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := pb.NewHostServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := &pb.Resources{CpuMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30}
	if err := st.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Register{Register: &pb.Register{
		HostId: id, Runtimes: []string{"process"}, Capacity: res, Allocatable: res, SandboxAddress: "127.0.0.1:1"}}}); err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil || first.GetRegistered() == nil {
		t.Fatalf("Register: %v, %v", first, err)
	}
	h := &rawHost{t: t, st: st, reg: first.GetRegistered(), acks: make(chan uint64, 16)}
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			if a := m.GetHeartbeatAck(); a != nil {
				h.acks <- a.Seq
			}
		}
	}()
	return h
}

// heartbeat sends a heartbeat with recs and waits for its ack.
func (h *rawHost) heartbeat(seq uint64, recs ...*pb.EgressRecord) {
	h.t.Helper()
	if err := h.st.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: &pb.Heartbeat{Seq: seq, Egress: recs}}}); err != nil {
		h.t.Fatal(err)
	}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case got := <-h.acks:
			if got >= seq {
				return
			}
		case <-timeout:
			h.t.Fatalf("no ack for heartbeat %d", seq)
		}
	}
}

func record(id, tenantID, sessionID, host string) *pb.EgressRecord {
	now := timestamppb.Now()
	return &pb.EgressRecord{Id: id, Tenant: tenantID, SessionId: sessionID, Host: host, Port: 443, Allowed: true, StartedAt: now, EndedAt: now}
}

// TestEgressRecordsVouchedByPlacements: the control plane stores a host's
// egress record only for a session placed on that host, under the
// placement's tenant; a record naming another tenant's session, or a
// session the host does not hold, is not stored and is counted. A record
// sent again (a lost ack) is stored once, and one that trails its
// placement's release within the grace is still stored.
func TestEgressRecordsVouchedByPlacements(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	for _, id := range []tenant.ID{"tenant_a", "tenant_b"} {
		if _, err := st.Tenants().Create(ctx, id, string(id)); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	rejected := map[string]int{}
	c := fleettest.Start(t, fleettest.Options{
		// The test's sink writes as the server's does, but at once: the
		// ack it waits for then says the rows are there.
		OnEgress: func(hostID string, recs []*pb.EgressRecord, _ int64, ack func()) {
			var rows []store.EgressRecord
			for _, r := range recs {
				rows = append(rows, store.EgressRecord{TenantID: tenant.ID(r.Tenant), SessionID: r.SessionId, Host: r.Host, Port: r.Port,
					Allowed: r.Allowed, Start: r.StartedAt.AsTime(), End: r.EndedAt.AsTime(), RecordID: r.Id})
			}
			if _, err := st.Egress().Append(ctx, hostID, rows); err != nil {
				t.Errorf("Append: %v", err)
				return
			}
			ack()
		},
		ObserveEgressRejected: func(reason string, n int) {
			mu.Lock()
			rejected[reason] += n
			mu.Unlock()
		},
	})
	h9 := connectRaw(t, c, "h9")
	if !h9.reg.EgressAcks {
		t.Fatal("Registered does not say the control plane acknowledges egress")
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// s1 (tenant_a's) is placed on h9, the only host; h8 comes after.
	if p, err := c.Fleet(0).Place(pctx, scheduler.Request{SessionID: "s1", Tenant: "tenant_a", Runtime: "process", Resources: scheduler.Resources{CPUMillis: 500}}); err != nil || p.HostID != "h9" {
		t.Fatalf("placed %+v, %v", p, err)
	}
	h8 := connectRaw(t, c, "h8")

	h9.heartbeat(1,
		record("r1", "tenant_a", "s1", "good.test"),        // placed on h9, its tenant
		record("r2", "tenant_b", "s1", "mislabelled.test"), // placed on h9, another tenant named
		record("r3", "tenant_b", "s-none", "nowhere.test"), // placed nowhere
	)
	h8.heartbeat(1, record("r1", "tenant_a", "s1", "elsewhere.test")) // placed on h9, not h8
	// Sent again, as after a lost ack: stored once.
	h9.heartbeat(2, record("r1", "tenant_a", "s1", "good.test"))

	trail := func(id tenant.ID) []store.EgressRecord {
		t.Helper()
		rows, err := st.Egress().List(tenant.With(ctx, id), "", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	if a := trail("tenant_a"); len(a) != 1 || a[0].Host != "good.test" || a[0].HostID != "h9" || a[0].SessionID != "s1" {
		t.Fatalf("tenant_a's trail: %+v", a)
	}
	if b := trail("tenant_b"); len(b) != 0 {
		t.Fatalf("tenant_b's trail: %+v", b)
	}
	mu.Lock()
	got := map[string]int{hosts.EgressNotPlaced: rejected[hosts.EgressNotPlaced], hosts.EgressTenantMismatch: rejected[hosts.EgressTenantMismatch]}
	mu.Unlock()
	if got[hosts.EgressNotPlaced] != 2 || got[hosts.EgressTenantMismatch] != 1 {
		t.Fatalf("rejected %v, want 2 not placed and 1 tenant mismatch", got)
	}

	// Released, s1 still vouches for h9's records within the grace.
	if _, err := c.Fleet(0).Release(pctx, "s1"); err != nil {
		t.Fatal(err)
	}
	h9.heartbeat(3, record("r4", "tenant_a", "s1", "trailing.test"))
	if a := trail("tenant_a"); len(a) != 2 || a[0].Host != "trailing.test" {
		t.Fatalf("tenant_a's trail after the release: %+v", a)
	}
}
