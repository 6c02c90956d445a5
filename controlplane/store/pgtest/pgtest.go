// Package pgtest gives tests a real PostgreSQL: one private cluster per `go
// test` process, started from the machine's binaries, and a fresh database per
// test, cloned from a migrated template so that each test starts from the
// current schema in milliseconds.
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		db := pgtest.New(t) // db.AppURL connects as the application role
//		...
//	}
//
// Where PostgreSQL cannot be started, tests skip and say why; under CI (the
// CI environment variable set) they fail instead, because a green run that
// skipped the database proves nothing.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/pglocal"
)

const template = "corral_template"

var (
	cluster  *pglocal.Cluster
	startErr error
	counter  atomic.Int64
)

// Main starts the cluster, runs the tests and stops it. Call it from TestMain.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "corral-pg-")
	if err != nil {
		startErr = err
		return m.Run()
	}
	defer os.RemoveAll(dir)
	// The server may run as another user (postgres, when tests run as root).
	_ = os.Chmod(dir, 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cluster, startErr = pglocal.Start(ctx, pglocal.Options{
		Dir: dir,
		// Durability buys nothing in a throwaway cluster.
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if startErr == nil {
		startErr = prepareTemplate(ctx)
	}
	cancel()
	code := m.Run()
	if cluster != nil {
		_ = cluster.Stop(context.Background())
	}
	return code
}

func prepareTemplate(ctx context.Context) error {
	if err := createDatabase(ctx, template, ""); err != nil {
		return err
	}
	if _, err := store.Migrate(ctx, cluster.URL(pglocal.OwnerRole, template), nil); err != nil {
		return fmt.Errorf("migrating template database: %w", err)
	}
	return nil
}

func createDatabase(ctx context.Context, name, from string) error {
	conn, err := pgx.Connect(ctx, cluster.SuperuserURL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	stmt := fmt.Sprintf("CREATE DATABASE %s OWNER %s", name, pglocal.OwnerRole)
	if from != "" {
		stmt += " TEMPLATE " + from
	}
	for _, s := range []string{stmt, fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s", name, pglocal.AppRole)} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// DB is one test's database.
type DB struct {
	Name string
	// OwnerURL connects as the owner role (migrations, test set-up).
	OwnerURL string
	// AppURL connects as the application role, subject to row-level security.
	AppURL string
	// SuperuserURL connects as the cluster's superuser.
	SuperuserURL string
}

// New returns a fresh database at the current schema. It is dropped when the
// test ends.
func New(t testing.TB) *DB { return newDB(t, template) }

// NewEmpty returns a fresh database with no migrations applied.
func NewEmpty(t testing.TB) *DB { return newDB(t, "") }

func newDB(t testing.TB, from string) *DB {
	t.Helper()
	requireCluster(t)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), counter.Add(1))
	ctx := context.Background()
	if err := createDatabase(ctx, name, from); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, cluster.SuperuserURL("postgres"))
		if err != nil {
			t.Errorf("pgtest: dropping %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: dropping %s: %v", name, err)
		}
	})
	return &DB{
		Name:         name,
		OwnerURL:     cluster.URL(pglocal.OwnerRole, name),
		AppURL:       cluster.URL(pglocal.AppRole, name),
		SuperuserURL: cluster.SuperuserURL(name),
	}
}

// Cluster returns the process's cluster, for tests that need more than a
// database (a second role, say).
func Cluster(t testing.TB) *pglocal.Cluster {
	t.Helper()
	requireCluster(t)
	return cluster
}

func requireCluster(t testing.TB) {
	t.Helper()
	if startErr == nil && cluster == nil {
		t.Fatal("pgtest: Main was not called from TestMain")
	}
	if startErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("pgtest: PostgreSQL is required under CI and did not start: %v", startErr)
		}
		t.Skipf("pgtest: PostgreSQL not available (%v); install the postgresql package to run this test", startErr)
	}
}
