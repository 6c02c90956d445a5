package store

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/internal/errdefs"
)

// sandboxLockSpace keeps session sandbox locks apart from any other
// advisory locks: the lock key is hashtext(sandboxLockSpace || session).
const sandboxLockSpace = "corral.sandbox:"

// LockSandbox takes a session's sandbox lock across every control-plane
// node sharing this database: a PostgreSQL session-level advisory lock,
// held on a connection of its own until unlock is called (or the
// connection dies, which releases it). It waits until the lock is free or
// ctx ends. Locks are not re-entrant: a holder that asks again waits for
// itself.
func (s *Store) LockSandbox(ctx context.Context, sessionKey string) (unlock func(), err error) {
	conn, err := s.lockPool.Acquire(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "locking the sandbox of session %s", sessionKey)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, sandboxLockSpace+sessionKey); err != nil {
		// A cancelled wait may still have taken the lock: close the
		// connection, which drops whatever it holds.
		_ = conn.Hijack().Close(context.Background())
		if ctx.Err() != nil {
			return nil, errdefs.Wrap(errdefs.KindOf(ctx.Err()), ctx.Err(), "waiting for the sandbox lock of session %s", sessionKey)
		}
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "locking the sandbox of session %s", sessionKey)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			var ok bool
			err := conn.QueryRow(context.Background(), `SELECT pg_advisory_unlock(hashtext($1))`, sandboxLockSpace+sessionKey).Scan(&ok)
			if err != nil || !ok {
				// The lock's state is unknown: the connection goes, and
				// with it the lock.
				_ = conn.Hijack().Close(context.Background())
				return
			}
			conn.Release()
		})
	}, nil
}

// ExistingSessions returns those of ids that name a session, in any tenant
// (through the SECURITY DEFINER function existing_sessions). The fleet's
// sweep uses it to release the placements of deleted sessions.
func (s *Store) ExistingSessions(ctx context.Context, ids []string) (map[string]bool, error) {
	out := make(map[string]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT session_id FROM existing_sessions($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("looking up sessions: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("looking up sessions: %w", err)
	}
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}
