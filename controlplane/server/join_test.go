package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
)

// joinAgent runs a host agent of cfg joined to srv with a fresh token,
// until the test ends, and waits until the node has its stream. Left
// empty in cfg: the control plane (srv's), a state dir (the test's),
// the listen address (loopback, any port) and the capacity (room for
// many sandboxes). The agent stops before cleanups registered earlier
// run (a driver's sweep).
func joinAgent(tb testing.TB, srv *server.Server, cfg agent.Config) *agent.Agent {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := srv.Hosts().IssueToken(ctx, time.Hour)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	cfg.ControlPlane, cfg.JoinToken = srv.HostAddr(), logging.Secret(tok.Reveal())
	if cfg.StateDir == "" {
		cfg.StateDir = tb.TempDir()
	}
	if cfg.ListenAddr == "" && cfg.Listener == nil {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.Capacity == (agent.Resources{}) {
		cfg.Capacity = agent.Resources{CPUMillis: 64000, MemoryBytes: 256 << 30, DiskBytes: 1 << 40}
	}
	a, err := agent.New(ctx, cfg)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	tb.Cleanup(func() { cancel(); wg.Wait() })
	waitfor.Cond(tb, 30*time.Second, "host "+cfg.HostID+" to connect", func() bool { return srv.Hosts().Connected(cfg.HostID) })
	return a
}
