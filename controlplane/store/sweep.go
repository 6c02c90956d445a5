package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

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

// ArchivedSessions returns those of ids that name an archived session, in
// any tenant, with the time each was archived (through the SECURITY
// DEFINER function archived_sessions). The fleet's sweep uses it to
// release the sandboxes of sessions archived past their retention.
func (s *Store) ArchivedSessions(ctx context.Context, ids []string) (map[string]time.Time, error) {
	out := make(map[string]time.Time, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT session_id, archived_at FROM archived_sessions($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("looking up archived sessions: %w", err)
	}
	type archived struct {
		ID string    `db:"session_id"`
		At time.Time `db:"archived_at"`
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[archived])
	if err != nil {
		return nil, fmt.Errorf("looking up archived sessions: %w", err)
	}
	for _, a := range got {
		out[a.ID] = a.At
	}
	return out, nil
}
