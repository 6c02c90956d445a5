package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"corral.dev/corral/internal/errdefs"
)

// What a database that went away looks like gets kind unavailable, so that
// callers (the agent loop) try again; anything else keeps its kind.
func TestUnavailable(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want errdefs.Kind
	}{
		{"admin shutdown (restart)", fmt.Errorf("starting tenant transaction: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}), errdefs.UnavailableKind},
		{"starting up", &pgconn.PgError{Severity: "FATAL", Code: "57P03"}, errdefs.UnavailableKind},
		{"connection failure", &pgconn.PgError{Code: "08006"}, errdefs.UnavailableKind},
		{"connection lost mid-read", fmt.Errorf("committing: %w", io.ErrUnexpectedEOF), errdefs.UnavailableKind},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, errdefs.UnavailableKind},
		{"unique violation", &pgconn.PgError{Code: "23505"}, errdefs.Unknown},
		{"statement error", errors.New("syntax error"), errdefs.Unknown},
		{"canceled", fmt.Errorf("query: %w", context.Canceled), errdefs.CanceledKind},
		{"already classified", errdefs.Conflict("stale runner"), errdefs.ConflictKind},
	} {
		err := unavailable(c.err)
		if got := errdefs.KindOf(err); got != c.want {
			t.Errorf("%s: kind %v, want %v", c.name, got, c.want)
		}
		if err.Error() != c.err.Error() {
			t.Errorf("%s: message %q, want %q", c.name, err, c.err)
		}
	}
}
