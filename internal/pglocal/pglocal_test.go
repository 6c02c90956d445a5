package pglocal

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func tempDir(t *testing.T) string {
	t.Helper()
	if _, err := findBinDir(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL binaries are required under CI: %v", err)
		}
		t.Skipf("PostgreSQL binaries not installed: %v", err)
	}
	dir, err := os.MkdirTemp("", "pglocal-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // the postgres user must reach it when tests run as root
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestStartStopRestartKeepsData(t *testing.T) {
	dir := filepath.Join(tempDir(t), "pg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c, err := Start(ctx, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	owner, err := pgx.Connect(ctx, c.URL(OwnerRole, Database))
	if err != nil {
		t.Fatalf("owner cannot connect: %v", err)
	}
	if _, err := owner.Exec(ctx, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('x')`); err != nil {
		t.Fatal(err)
	}
	owner.Close(ctx)
	// The application role logs in but owns nothing.
	app, err := pgx.Connect(ctx, c.URL(AppRole, Database))
	if err != nil {
		t.Fatalf("app role cannot connect: %v", err)
	}
	if _, err := app.Exec(ctx, `SELECT * FROM kept`); err == nil {
		t.Fatal("the app role read a table nobody granted it")
	}
	app.Close(ctx)
	// Password authentication is on: a wrong password is refused.
	bad := strings.Replace(c.URL(AppRole, Database), c.Credentials().AppPassword, "wrong", 1)
	if conn, err := pgx.Connect(ctx, bad); err == nil {
		conn.Close(ctx)
		t.Fatal("connected with a wrong password")
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	select {
	case <-c.Exited():
	default:
		t.Fatal("Stop returned before the server exited")
	}

	c2, err := Start(ctx, Options{Dir: dir})
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer c2.Stop(ctx)
	conn, err := pgx.Connect(ctx, c2.URL(OwnerRole, Database))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != "x" {
		t.Fatalf("data after restart: %q, %v", v, err)
	}

	// Restart in place: connections end, the same URL works again.
	if err := c2.Restart(ctx, nil); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection outlived the restart")
	}
	again, err := pgx.Connect(ctx, c2.URL(OwnerRole, Database))
	if err != nil {
		t.Fatalf("connecting after Restart: %v", err)
	}
	defer again.Close(ctx)
	if err := again.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != "x" {
		t.Fatalf("data after Restart: %q, %v", v, err)
	}
}

func TestStartErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Start(ctx, Options{}); err == nil {
		t.Error("Start without a directory succeeded")
	}
	if _, err := Start(ctx, Options{Dir: t.TempDir(), BinDir: "/nonexistent"}); err == nil || !strings.Contains(err.Error(), "no initdb") {
		t.Errorf("bad BinDir: %v", err)
	}
}
