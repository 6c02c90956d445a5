package tools_test

import (
	"context"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"net"
	"testing"
	"time"

	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

const debianImage = "localhost/corral/debian:bookworm-1"

// host is a hostctl controller with one real host agent joined, and one
// sandbox ensured on it.
type host struct {
	ctl *hostctl.Controller
	sc  pb.SandboxServiceClient
	key string
}

// Sandbox is the ensured sandbox as the tools see it.
func (h *host) Sandbox() tools.Sandbox { return tools.Remote{Client: h.sc, Key: h.key} }

// startHost joins an agent over d to a fresh controller and ensures a
// sandbox of image.
func startHost(t testing.TB, d driver.Driver, runtime, image string) *host {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ctl, err := hostctl.New(hostctl.Config{Dir: t.TempDir(), HeartbeatInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := ctl.Serve(l)
	t.Cleanup(srv.Stop)
	tok, err := ctl.IssueToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(ctx, agent.Config{
		HostID: "h1", ControlPlane: l.Addr().String(), JoinToken: logging.Secret(tok.Reveal()), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: runtime,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	if err := ctl.Wait(wctx, func(hs map[string]hostctl.Host) bool { return hs["h1"].Connected }); err != nil {
		t.Fatal(err)
	}
	key := "sess-tools"
	if _, err := ctl.Ensure(wctx, "h1", &pb.EnsureSandbox{Key: key, Image: image, Runtime: runtime}); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := ctl.Destroy(dctx, "h1", key); err != nil {
			t.Errorf("destroying the sandbox: %v", err)
		}
	})
	sc, closeFn, err := ctl.DialSandbox("h1", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFn() })
	return &host{ctl: ctl, sc: sc, key: key}
}

// processHost runs the process driver: a folder on this machine.
func processHost(t testing.TB) *host {
	t.Helper()
	d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	return startHost(t, d, "process", "")
}

// gvisorHost runs containerd with gVisor and the Debian image. Outside CI it
// skips, saying why, when the machine cannot; under CI it fails instead.
func gvisorHost(t testing.TB) *host {
	t.Helper()
	return startHost(t, gvisorDriver(t), containerd.RuntimeGVisor, debianImage)
}

// gvisorDriver is the containerd driver with gVisor, or a skip (a failure
// under CI) saying why the machine cannot run it.
func gvisorDriver(t testing.TB) *containerd.Driver {
	t.Helper()
	return containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
}
