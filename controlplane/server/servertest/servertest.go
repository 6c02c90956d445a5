// Package servertest starts control-plane nodes in process for tests: on free
// loopback ports, against a database from pgtest, stopped when the test ends.
package servertest

import (
	"context"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/store/pgtest"
)

// Start runs a node on db (migrating it as the owner) and returns it once it
// serves. cfg may set anything else; its addresses and database URLs are
// filled in. Unless cfg names a data directory or a cluster to join, the node
// bootstraps a one-node Raft cluster in a temporary directory, with
// test-sized Raft timers unless cfg sets them.
func Start(t testing.TB, db *pgtest.DB, cfg server.Config) *server.Server {
	t.Helper()
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.HostAddr == "" && cfg.HostListener == nil {
		cfg.HostAddr = "127.0.0.1:0"
	}
	if cfg.RaftAddr == "" {
		cfg.RaftAddr = "127.0.0.1:0"
	}
	if cfg.RaftHTTPAddr == "" {
		cfg.RaftHTTPAddr = "127.0.0.1:0"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
		cfg.Bootstrap = cfg.Join == ""
	}
	if cfg.RaftHeartbeatTimeout == 0 && cfg.RaftElectionTimeout == 0 {
		cfg.RaftHeartbeatTimeout, cfg.RaftElectionTimeout = 300*time.Millisecond, 300*time.Millisecond
	}
	cfg.DatabaseURL, cfg.MigrationDatabaseURL = db.AppURL, db.OwnerURL
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("server.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return srv
}
