// Package store is corral's system of record in PostgreSQL: tenant-scoped
// repositories over the sqlc-generated queries in store/internal/db, and the
// embedded migrations.
//
// Every tenant-owned read or write runs in a transaction that first sets
// corral.tenant_id from tenant.Required(ctx), and every query also names that
// tenant in its WHERE clause (the transaction hands the id to its callback).
// These are two independent layers: row-level security policies on every
// tenant-owned table key on the setting, so a query can only see its own
// tenant's rows even if its WHERE clause forgets to say so, and the WHERE
// clauses keep the queries confined if a table ever lost its policy.
//
// Vault credentials' secrets are stored only as ciphertext under a
// per-tenant data key that the cluster's seal keyring seals (datakeys.go).
//
// Self-hosted environments' work queues (work.go, migration 00075) are rows
// too: a poll claims an item with FOR UPDATE SKIP LOCKED, a heartbeat
// compares and moves the lease under the item's row lock, and a node's
// long polls wait on an in-process signal, raised by its own enqueues and
// by every node's (the WorkChannel notification, which the events hub
// hands to WorkNotified).
//
// Usage for billing (usage.go, migration 00110) is tenant rows too: model
// tokens added with the events of their model request, and sandbox
// intervals written by controlplane/usage's meter under a fence of the
// Raft term. Operators' reports read every tenant's through a SECURITY
// DEFINER function and owner read policies, as the audit log's do.
//
// The pool connects as the application role, which must not own the tables nor
// bypass row-level security; Open refuses to run otherwise.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Options tune the pool.
type Options struct {
	// ConnectTimeout bounds the first connection. Default 10s.
	ConnectTimeout time.Duration
	// MaxConns caps the pool. Default 20.
	MaxConns int32
	// AllowPrivilegedRole skips the check that the role neither owns the
	// tables nor bypasses row-level security. Only tests of the check use it.
	AllowPrivilegedRole bool
	// DefaultConcurrentSessions caps each tenant's live sessions unless the
	// tenant has its own limit; 0 means no limit.
	DefaultConcurrentSessions int
	Logger                    *slog.Logger
}

// Store is the handle every repository hangs off.
type Store struct {
	pool            *pgxpool.Pool
	log             *slog.Logger
	defaultSessions int
	// work wakes this node's long polls of self-hosted work queues.
	work workSignal
	// onAppend, if set, is told of Append's commits (ObserveAppends).
	onAppend atomic.Pointer[AppendObserver]
}

// Open connects to databaseURL and checks that the connected role is
// subject to row-level security.
func Open(ctx context.Context, databaseURL string, opts Options) (*Store, error) {
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "database url")
	}
	cfg.MaxConns = opts.MaxConns
	cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "connecting to database")
	}
	s := &Store{pool: pool, log: opts.Logger, defaultSessions: opts.DefaultConcurrentSessions}
	pctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		s.Close()
		return nil, errdefs.Unavailable("connecting to database at %s:%d as %s: %s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.User, lastLine(err))
	}
	if !opts.AllowPrivilegedRole {
		if err := s.checkRole(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close releases the pools.
func (s *Store) Close() {
	s.pool.Close()
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return errdefs.Wrap(errdefs.UnavailableKind, err, "database")
	}
	return nil
}

// lastLine keeps the innermost cause of a pgx connection error, which lists
// every address it tried on lines of their own.
func lastLine(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if _, rest, ok := strings.Cut(l, "dial error: "); ok {
		return rest
	}
	return l
}

// checkRole refuses a role that would make row-level security moot.
func (s *Store) checkRole(ctx context.Context) error {
	var role string
	var super, bypass bool
	var owned int
	err := s.pool.QueryRow(ctx, `
		SELECT r.rolname, r.rolsuper, r.rolbypassrls,
		       (SELECT count(*) FROM pg_tables t WHERE t.schemaname = 'public' AND t.tableowner = current_user)
		FROM pg_roles r WHERE r.rolname = current_user`).Scan(&role, &super, &bypass, &owned)
	if err != nil {
		return fmt.Errorf("checking database role: %w", err)
	}
	switch {
	case super:
		return errdefs.FailedPrecondition("database role %q is a superuser, which bypasses row-level security; connect as the application role (see README, \"Database roles\")", role)
	case bypass:
		return errdefs.FailedPrecondition("database role %q has BYPASSRLS; connect as the application role (see README, \"Database roles\")", role)
	case owned > 0:
		return errdefs.FailedPrecondition("database role %q owns %d tables, so row-level security does not bind it; connect as the application role (see README, \"Database roles\")", role, owned)
	}
	return nil
}

// inTenant runs fn in a transaction scoped to the tenant in ctx; fn receives
// that tenant's id, which every query it makes passes as its tenant filter.
func (s *Store) inTenant(ctx context.Context, fn func(q *db.Queries, tid string) error) error {
	return s.inTenantTx(ctx, func(_ *tenantTx, q *db.Queries, tid string) error { return fn(q, tid) })
}

// inTenantTx is inTenant for the few statements sqlc cannot express, which
// need the transaction's connection itself.
//
// The transaction begins with its first statement, in one round trip with
// it (tenantTx), which every request pays for; that is why this does not
// use pgx.BeginFunc. A callback that makes no statement costs nothing.
func (s *Store) inTenantTx(ctx context.Context, fn func(tx *tenantTx, q *db.Queries, tid string) error) (err error) {
	return s.tenantTx(ctx, false, fn)
}

// inTenantRead is inTenant for a callback that makes exactly one
// statement, a read on the hot path (a session's row, a page of its log):
// BEGIN, the tenant setting, the statement and COMMIT go in one round
// trip. A second statement fails.
func (s *Store) inTenantRead(ctx context.Context, fn func(q *db.Queries, tid string) error) error {
	return s.tenantTx(ctx, true, func(_ *tenantTx, q *db.Queries, tid string) error { return fn(q, tid) })
}

// tenantTx runs fn in a tenant transaction; one makes it a one-statement
// transaction (inTenantRead).
func (s *Store) tenantTx(ctx context.Context, one bool, fn func(tx *tenantTx, q *db.Queries, tid string) error) (err error) {
	id, err := tenant.Required(ctx)
	if err != nil {
		return err
	}
	if err := id.Validate(); err != nil {
		return err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return errdefs.Wrap(errdefs.UnavailableKind, err, "database")
	}
	// A connection left inside a transaction (a failed ROLLBACK) is closed
	// by the pool on release rather than reused.
	defer conn.Release()
	tx := &tenantTx{conn: conn, tid: string(id), one: one}
	if err := fn(tx, db.New(tx), string(id)); err != nil {
		if tx.begun && !tx.ended {
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
				return unavailable(errors.Join(err, fmt.Errorf("rolling back: %w", rerr)))
			}
		}
		return unavailable(err)
	}
	if !tx.begun || tx.ended {
		return nil
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return unavailable(fmt.Errorf("committing: %w", err))
	}
	return nil
}

// unavailable gives kind unavailable to an error nobody classified that
// says the database went away for a moment (see lostDatabase): callers
// may try again.
func unavailable(err error) error {
	if errdefs.KindOf(err) != errdefs.Unknown || !lostDatabase(err) {
		return err
	}
	return errdefs.Wrap(errdefs.UnavailableKind, err, "")
}

// lostDatabase reports whether err is the database shutting down or
// restarting, or a connection to it refused or lost, rather than anything
// about the statement.
func lostDatabase(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection_exception
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err)
}

// translate gives database errors corral's kinds.
func translate(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return errdefs.NotFound("%s not found", what)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505": // unique_violation
			return errdefs.Wrap(errdefs.AlreadyExistsKind, err, "%s already exists", what)
		case "23503": // foreign_key_violation
			return errdefs.Wrap(errdefs.FailedPreconditionKind, err, "%s refers to something that does not exist", what)
		case "22021", "22P05": // character_not_in_repertoire, untranslatable_character
			return errdefs.InvalidArgument("%s: text that PostgreSQL cannot store (invalid UTF-8 or NUL)", what)
		case "42501": // insufficient_privilege, including row-level security violations
			return errdefs.Wrap(errdefs.PermissionDeniedKind, err, "%s", what)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
