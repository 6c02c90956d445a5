package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"corral.dev/corral/internal/errdefs"
)

//go:embed migrations/*.sql
var migrations embed.FS

// MigrationResult reports what Migrate did.
type MigrationResult struct {
	Applied []int64 // versions applied by this call, in order
	Version int64   // schema version afterwards
}

// Migrate applies every pending migration over ownerURL, which must connect as
// the role that owns (or will own) the tables. Several nodes may call it at
// once: a session-level advisory lock makes them take turns, and the ones that
// come second find nothing left to do.
func Migrate(ctx context.Context, ownerURL string, log *slog.Logger) (MigrationResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := stdlibConfig(ownerURL)
	if err != nil {
		return MigrationResult{}, err
	}
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	p, err := newProvider(sqlDB)
	if err != nil {
		return MigrationResult{}, err
	}
	results, err := p.Up(ctx)
	var res MigrationResult
	for _, r := range results {
		if r.Error == nil && !r.Empty {
			res.Applied = append(res.Applied, r.Source.Version)
			log.Info("applied migration", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
		}
	}
	if err != nil {
		return res, fmt.Errorf("applying migrations: %w", err)
	}
	if res.Version, err = p.GetDBVersion(ctx); err != nil {
		return res, fmt.Errorf("reading schema version: %w", err)
	}
	return res, nil
}

// SchemaVersion returns the version the database is at, and the newest this
// binary knows. A database that was never migrated is at version 0.
func (s *Store) SchemaVersion(ctx context.Context) (current, latest int64, err error) {
	latest, err = LatestSchemaVersion()
	if err != nil {
		return 0, 0, err
	}
	err = s.pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
		return 0, latest, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("reading schema version: %w", err)
	}
	return current, latest, nil
}

// LatestSchemaVersion is the version of the newest embedded migration. File
// names start with their version: 00001_tenants.sql is version 1.
func LatestSchemaVersion() (int64, error) {
	entries, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return 0, fmt.Errorf("migration %s: name must start with its version number", e.Name())
		}
		latest = max(latest, v)
	}
	return latest, nil
}

func newProvider(sqlDB *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(database.DialectPostgres, sqlDB, sub, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("loading migrations: %w", err)
	}
	return p, nil
}

func stdlibConfig(url string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "database url")
	}
	return cfg, nil
}
