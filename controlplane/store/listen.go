package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DeltasChannel carries live previews (event_start, event_delta) between
// nodes. They are never stored.
const DeltasChannel = "corral_deltas"

// Listen holds one connection that listens on channels and calls fn for
// each notification, in the order PostgreSQL delivers them, until ctx ends
// or the connection fails (then it returns the error; callers reconnect).
// ready, if not nil, is called once the LISTENs are in place.
func (s *Store) Listen(ctx context.Context, channels []string, ready func(), fn func(channel, payload string)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	// The connection leaves the pool for good: LISTEN state must not leak
	// into other queries.
	pc := conn.Hijack()
	defer pc.Close(context.Background())
	for _, ch := range channels {
		if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listening on %s: %w", ch, err)
		}
	}
	if ready != nil {
		ready()
	}
	for {
		n, err := pc.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("waiting for notifications: %w", err)
		}
		fn(n.Channel, n.Payload)
	}
}

// Notify sends a notification now (outside any transaction).
func (s *Store) Notify(ctx context.Context, channel, payload string) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
	return err
}
