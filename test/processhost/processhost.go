// Package processhost joins host agents that run commands with the process
// driver to control-plane nodes started in process (servertest), for tests
// of the control plane that need a host but not a sandbox runtime.
package processhost

import (
	"context"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
)

// Start joins host agent id to srv with a join token srv issues, and
// returns once srv sees it connected. The agent's configuration, edited by
// edit when it is not nil, starts as: the process driver (untrusted code
// allowed), runtime "process", 4 CPUs, 8 GiB of memory and of disk, and a
// 50 ms reconnect delay. The agent stops when the test ends, or at stop.
func Start(t testing.TB, srv *server.Server, id string, edit func(*agent.Config)) (d *process.Driver, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := srv.Hosts().IssueToken(ctx, time.Hour)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	d, err = process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cfg := agent.Config{
		HostID: id, ControlPlane: srv.HostAddr(), JoinToken: logging.Secret(tok.Reveal()), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: "process",
		Capacity:       agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30},
		ReconnectDelay: 50 * time.Millisecond,
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := agent.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	waitfor.Cond(t, 30*time.Second, "host "+id+" connected", func() bool { return srv.Hosts().Connected(id) })
	return d, stop
}
