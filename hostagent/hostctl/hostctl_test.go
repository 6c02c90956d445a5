package hostctl_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// setup runs a controller with its local control socket and one agent on
// the fake driver, connected.
func setup(t *testing.T) (*hostctl.Controller, *hostctl.LocalClient, string) {
	t.Helper()
	dir := t.TempDir()
	ctl, err := hostctl.New(hostctl.Config{Dir: dir, HeartbeatInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := ctl.Serve(l)
	t.Cleanup(srv.Stop)
	sock := filepath.Join(dir, "hostctl.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: hostctl.LocalHandler(ctl)}
	go hs.Serve(ul)
	t.Cleanup(func() { hs.Close() })
	client, err := hostctl.NewLocalClient(sock)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	tok, err := client.Token(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	a, err := agent.New(ctx, agent.Config{
		HostID: "h1", ControlPlane: l.Addr().String(), JoinToken: logging.Secret(tok), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: drivertest.NewFake(t.TempDir()), Runtime: "fake",
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := ctl.Wait(wctx, func(hs map[string]hostctl.Host) bool { return hs["h1"].Connected && hs["h1"].Heartbeats > 0 }); err != nil {
		t.Fatal(err)
	}
	return ctl, client, l.Addr().String()
}

func TestLocalControlAPI(t *testing.T) {
	_, client, _ := setup(t)
	ctx := context.Background()
	h, err := client.Host(ctx, "h1")
	if err != nil || !h.Connected || h.SandboxAddress == "" || len(h.Runtimes) != 1 || h.Runtimes[0] != "fake" {
		t.Fatalf("host h1: %+v %v", h, err)
	}
	if _, err := client.Host(ctx, "h2"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown host: %v", err)
	}
	st, err := client.Ensure(ctx, hostctl.EnsureRequest{Host: "h1", Key: "s1", Image: "img"})
	if err != nil || !strings.Contains(string(st), "SANDBOX_STATE_READY") {
		t.Fatalf("ensure: %s %v", st, err)
	}
	if _, err := client.Ensure(ctx, hostctl.EnsureRequest{Host: "h1", Key: "s2", Runtime: "gvisor"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("ensure for the wrong runtime: %v, want invalid argument carried through", err)
	}
	if _, err := client.Ensure(ctx, hostctl.EnsureRequest{Host: "h2", Key: "s1"}); !errdefs.IsUnavailable(err) {
		t.Fatalf("ensure on an unknown host: %v", err)
	}
	if h, _ := client.Host(ctx, "h1"); strings.Join(h.Placed, ",") != "s1" {
		t.Fatalf("placed = %v, want only s1 (the host refused s2)", h.Placed)
	}
	if err := client.Destroy(ctx, "h1", "s1"); err != nil {
		t.Fatal(err)
	}
	if h, _ := client.Host(ctx, "h1"); len(h.Placed) != 0 {
		t.Fatalf("placed after destroy = %v", h.Placed)
	}
	tok, err := client.Token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hostpki.ParseJoinToken(tok); err != nil {
		t.Fatalf("token %q: %v", tok, err)
	}
}

func TestNewLocalClientWithoutServer(t *testing.T) {
	_, err := hostctl.NewLocalClient(filepath.Join(t.TempDir(), "hostctl.sock"))
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "hostctl serve") {
		t.Fatalf("no server: %v", err)
	}
}

func TestConnectNeedsAHostCertificate(t *testing.T) {
	ctl, client, addr := setup(t)
	tok, err := client.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	jt, _ := hostpki.ParseJoinToken(tok)
	// Trusting the server is not enough: without a client certificate the
	// handshake succeeds (Join needs that) but Connect is refused.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(hostpki.PinnedClientTLS(jt.CAPin))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := pb.NewHostServiceClient(conn).Connect(ctx)
	if err == nil {
		_ = st.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Register{Register: &pb.Register{HostId: "h1"}}})
		_, err = st.Recv()
	}
	if errdefs.KindOf(errgrpc.FromStatus(err)) != errdefs.UnauthenticatedKind {
		t.Fatalf("Connect without a certificate: %v", err)
	}
	if n := ctl.Hosts()["h1"].Registers; n != 1 {
		t.Fatalf("h1 registered %d times, want 1 (the impostor must not count)", n)
	}
}

func TestRestartedControllerAdoptsSandboxes(t *testing.T) {
	dir := t.TempDir()
	ctl, err := hostctl.New(hostctl.Config{Dir: dir, HeartbeatInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := ctl.Serve(l)
	tok, err := ctl.IssueToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fake := drivertest.NewFake(t.TempDir())
	reconnect := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	a, err := agent.New(ctx, agent.Config{
		HostID: "h1", ControlPlane: l.Addr().String(), JoinToken: logging.Secret(tok.Reveal()), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: fake, Runtime: "fake",
		After: func(time.Duration) <-chan time.Time { return reconnect },
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := ctl.Wait(wctx, func(hs map[string]hostctl.Host) bool { return hs["h1"].Connected }); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.Ensure(wctx, "h1", &pb.EnsureSandbox{Key: "s1"}); err != nil {
		t.Fatal(err)
	}

	// hostctl restarts: same CA, same address, no memory of placements.
	srv.Stop()
	ctl2, err := hostctl.New(hostctl.Config{Dir: dir, HeartbeatInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.Listen("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv2 := ctl2.Serve(l2)
	defer srv2.Stop()
	seen := make(chan error, 1)
	go func() {
		// The first heartbeat follows the agent's reconciliation.
		seen <- ctl2.Wait(wctx, func(hs map[string]hostctl.Host) bool { return hs["h1"].Heartbeats > 0 })
	}()
	for waiting := true; waiting; {
		select {
		case reconnect <- time.Now():
		case err := <-seen:
			if err != nil {
				t.Fatal(err)
			}
			waiting = false
		}
	}
	if p := ctl2.Hosts()["h1"].Placed; len(p) != 1 || p[0] != "s1" {
		t.Fatalf("restarted controller placed %v, want [s1]", p)
	}
	if refs, _ := fake.List(ctx); len(refs) != 1 {
		t.Fatalf("the host holds %v after hostctl restarted, want s1 kept", refs)
	}
}
