package hosts_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The heartbeat benchmark runs the simulated hosts in a child process (this
// test binary, running TestHeartbeatHostsHelper), so that the parent's CPU
// time is the leader's alone.
const (
	helperEnv   = "CORRAL_HEARTBEAT_HELPER" // the credentials directory
	benchWindow = 5 * time.Second
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHeartbeats5000Hosts measures the leader's CPU while 5,000 hosts
// (CORRAL_BENCH_HOSTS to change) heartbeat once per second: a one-node
// cluster, so the process is the leader and nothing else. It reports the CPU
// as a percentage of one core over a 5s window after every host connected.
func BenchmarkHeartbeats5000Hosts(b *testing.B) {
	n := 5000
	if v := os.Getenv("CORRAL_BENCH_HOSTS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, err := raftfsm.Start(ctx, raftfsm.Config{ID: "n1", RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: b.TempDir(),
		Bootstrap: true, HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: time.Second, LeaderLeaseTimeout: 150 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Shutdown()
	svc, err := hosts.New(ctx, hosts.Config{Node: node, HeartbeatInterval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	svc.Serve(l)
	defer svc.Close()

	dir := b.TempDir()
	writeHostCredentials(b, svc.CA(), dir, n)
	child := exec.Command(os.Args[0], "-test.run=^TestHeartbeatHostsHelper$", "-test.v")
	child.Env = append(os.Environ(), helperEnv+"="+dir, "CORRAL_HELPER_ADDR="+svc.Addr(), "CORRAL_HELPER_HOSTS="+strconv.Itoa(n))
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = child.Process.Kill()
		_ = child.Wait()
		if b.Failed() {
			b.Logf("helper output:\n%s", out.String())
		}
	}()
	start := time.Now()
	waitfor.State(b, 4*time.Minute, fmt.Sprintf("%d hosts to connect", n), func() (bool, string) {
		c := svc.ConnectedHosts()
		return c >= n, fmt.Sprintf("%d connected", c)
	})
	b.Logf("%d hosts registered through raft and connected in %v", n, time.Since(start).Round(time.Millisecond))
	// Not a wait for an event: the connection storm's after-effects (TLS
	// handshakes, first heartbeats through Raft) fade out over a while, and
	// the measurement must not include them.
	time.Sleep(2 * time.Second)

	b.ResetTimer()
	cpu0, hb0, t0 := cpuTime(), svc.Heartbeats(), time.Now()
	time.Sleep(benchWindow) // the measurement window, not a wait for an event
	cpu1, hb1, t1 := cpuTime(), svc.Heartbeats(), time.Now()
	b.StopTimer()
	wall := t1.Sub(t0)
	b.ReportMetric(100*float64(cpu1-cpu0)/float64(wall), "leader-cpu-%")
	b.ReportMetric(float64(hb1-hb0)/wall.Seconds(), "heartbeats/s")
	b.ReportMetric(float64(n), "hosts")
}

// writeHostCredentials writes the CA, one host key and n host
// certificates (host ids sim-0 … sim-<n-1>) into dir.
func writeHostCredentials(b *testing.B, ca *hostpki.CA, dir string, n int) {
	key, csr, err := hostpki.NewKeyAndCSR("sim")
	if err != nil {
		b.Fatal(err)
	}
	if err := hostpki.WriteKeyPEM(filepath.Join(dir, "key.pem"), key); err != nil {
		b.Fatal(err)
	}
	var certs bytes.Buffer
	for i := range n {
		der, err := ca.SignHost(csr, fmt.Sprintf("sim-%d", i), 0)
		if err != nil {
			b.Fatal(err)
		}
		certs.Write(hostpki.CertPEM(der))
	}
	if err := os.WriteFile(filepath.Join(dir, "certs.pem"), certs.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), hostpki.CertPEM(ca.Cert.Raw), 0o600); err != nil {
		b.Fatal(err)
	}
}

// TestHeartbeatHostsHelper is the benchmark's child process: simulated
// hosts that register and heartbeat every second until killed.
func TestHeartbeatHostsHelper(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("helper process of BenchmarkHeartbeats5000Hosts; runs only when the benchmark starts it")
	}
	addr := os.Getenv("CORRAL_HELPER_ADDR")
	ca, err := hostpki.ReadCertPEM(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := hostpki.ReadKeyPEM(filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "certs.pem"))
	if err != nil {
		t.Fatal(err)
	}
	var leaves []*x509.Certificate
	for blk, rest := pem.Decode(raw); blk != nil; blk, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, c)
	}
	sem := make(chan struct{}, 64) // connections being set up at once
	var wg sync.WaitGroup
	for i, leaf := range leaves {
		wg.Go(func() {
			sem <- struct{}{}
			cert := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
			hb, err := simulateHost(addr, ca, cert, leaf.Subject.CommonName)
			<-sem
			if err != nil {
				t.Errorf("host %d: %v", i, err)
				return
			}
			hb()
		})
	}
	wg.Wait()
}

// simulateHost connects and registers, and returns a function that
// heartbeats every second until the stream breaks.
func simulateHost(addr string, ca *x509.Certificate, cert tls.Certificate, id string) (func(), error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(hostpki.ClientTLS(ca, &cert, hostpki.ControlPlaneName))))
	if err != nil {
		return nil, err
	}
	st, err := pb.NewHostServiceClient(conn).Connect(context.Background())
	if err != nil {
		return nil, err
	}
	reg := &pb.Register{HostId: id, Runtimes: []string{"process"}, SandboxAddress: "127.0.0.1:1",
		Capacity: &pb.Resources{CpuMillis: 16000, MemoryBytes: 64 << 30, DiskBytes: 512 << 30}}
	if err := st.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Register{Register: reg}}); err != nil {
		return nil, err
	}
	if _, err := st.Recv(); err != nil {
		return nil, err
	}
	return func() {
		defer conn.Close()
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					return
				}
			}
		}()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for range t.C {
			hb := &pb.Heartbeat{SentAt: timestamppb.Now(), Allocated: &pb.Resources{}, Used: &pb.Resources{MemoryBytes: 1 << 30}}
			if err := st.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: hb}}); err != nil {
				return
			}
		}
	}, nil
}
