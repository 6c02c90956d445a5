// Package servertest starts control-plane nodes in process for tests: on free
// loopback ports, against a database from pgtest, stopped when the test ends.
package servertest

import (
	"context"
	"testing"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/store/pgtest"
)

// Start runs a node on db (migrating it as the owner) and returns it once it
// serves. cfg may set anything else; its addresses and database URLs are
// filled in.
func Start(t testing.TB, db *pgtest.DB, cfg server.Config) *server.Server {
	t.Helper()
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
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
