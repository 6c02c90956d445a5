package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"corral.dev/corral/controlplane/store/internal/db"
)

// tenantTx is the connection of a tenant transaction (inTenantTx), as the
// queries see it (db.DBTX). It begins the transaction lazily: BEGIN and
// the tenant setting go to the server in one pipeline with the
// transaction's first statement, so a transaction of one statement costs
// two round trips (that one and COMMIT) instead of three, and the event
// log's appends, which end with queryRowCommit, one or two instead of
// four. Every turn of every session makes a dozen of these transactions
// on its path.
//
// pgx's batches are its pipeline: the statements of one batch go out
// together and the server answers them in order, skipping what follows a
// failed one, so nothing runs outside the transaction or before the
// tenant is set.
//
// A transaction of one read (inTenantRead) sends COMMIT in the same
// pipeline too: one round trip for the whole transaction.
type tenantTx struct {
	conn *pgxpool.Conn
	tid  string
	// one: the transaction is one statement, committed with it.
	one bool
	// begun: BEGIN was sent (the transaction may be open, whatever its
	// outcome); ended: COMMIT went with the last statement and succeeded.
	begun, ended bool
}

// errSecondStatement is a one-statement transaction's answer to a second
// statement: after its COMMIT, a statement would run without the tenant
// setting (and see nothing, under row-level security).
var errSecondStatement = errors.New("store: a one-statement tenant transaction made a second statement")

var _ db.DBTX = (*tenantTx)(nil)

// batch returns a batch that begins the transaction first, unless it has
// begun, and how many of its results are the beginning's.
func (t *tenantTx) batch() (*pgx.Batch, int, error) {
	b := &pgx.Batch{}
	if t.begun {
		if t.one {
			return nil, 0, errSecondStatement
		}
		return b, 0, nil
	}
	t.begun = true
	b.Queue("BEGIN")
	b.Queue("SELECT set_config('corral.tenant_id', $1, true)", t.tid)
	return b, 2, nil
}

// send sends b and reads the results of its first skip statements (the
// beginning), so that the next result is the caller's statement's.
func (t *tenantTx) send(ctx context.Context, b *pgx.Batch, skip int) (pgx.BatchResults, error) {
	br := t.conn.SendBatch(ctx, b)
	for range skip {
		if _, err := br.Exec(); err != nil {
			return nil, errors.Join(err, br.Close())
		}
	}
	return br, nil
}

// commitWith queues COMMIT after the statement in b when the transaction
// is one statement.
func (t *tenantTx) commitWith(b *pgx.Batch) {
	if t.one {
		b.Queue("COMMIT")
	}
}

// readCommit reads the result of the COMMIT commitWith queued, if any,
// and closes br.
func (t *tenantTx) readCommit(br pgx.BatchResults) error {
	var err error
	if t.one {
		err = t.committed(br.Exec())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// committed checks COMMIT's result and records that the transaction ended.
func (t *tenantTx) committed(tag pgconn.CommandTag, err error) error {
	if err == nil && tag.String() != "COMMIT" {
		// The server answers COMMIT with ROLLBACK when the transaction
		// had failed: never the case here, since each statement's error
		// is returned first, but never taken for a commit.
		err = errors.New("the transaction was rolled back at its commit")
	}
	if err == nil {
		t.ended = true
	}
	return err
}

// first sends sql as the transaction's first statement: after its
// beginning, and before its COMMIT in a one-statement transaction; the
// next result of the batch returned is sql's. Once the transaction has
// begun it returns no batch: sql goes to the connection as it is.
func (t *tenantTx) first(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b, skip, err := t.batch()
	if err != nil || skip == 0 {
		return nil, err
	}
	b.Queue(sql, args...)
	t.commitWith(b)
	return t.send(ctx, b, skip)
}

// Exec implements db.DBTX.
func (t *tenantTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := t.first(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if br == nil {
		return t.conn.Exec(ctx, sql, args...)
	}
	tag, err := br.Exec()
	if err != nil {
		return tag, errors.Join(err, br.Close())
	}
	return tag, t.readCommit(br)
}

// Query implements db.DBTX. The rows returned hold the batch until they
// are closed.
func (t *tenantTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := t.first(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	if br == nil {
		return t.conn.Query(ctx, sql, args...)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	return &batchRows{Rows: rows, t: t, br: br}, nil
}

// QueryRow implements db.DBTX.
func (t *tenantTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := t.first(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	if br == nil {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	return batchRow{row: br.QueryRow(), t: t, br: br}
}

// queryRow runs a statement that returns one row, into dest.
func (t *tenantTx) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return t.QueryRow(ctx, sql, args...).Scan(dest...)
}

// queryRowCommit runs the transaction's last statement, which returns one
// row (into dest), and COMMIT in one round trip (with BEGIN too, if it is
// the only one). inTenantTx commits nothing after it; if it fails, the
// transaction is rolled back as after any failed statement (a COMMIT the
// server skipped because the statement failed leaves it open and aborted).
func (t *tenantTx) queryRowCommit(ctx context.Context, sql string, args []any, dest ...any) error {
	b, skip, err := t.batch()
	if err != nil {
		return err
	}
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br, err := t.send(ctx, b, skip)
	if err != nil {
		return err
	}
	err = br.QueryRow().Scan(dest...)
	if err == nil || errors.Is(err, pgx.ErrNoRows) { // no row: the statement ran, and so does COMMIT
		if cerr := t.committed(br.Exec()); cerr != nil {
			err = cerr
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batchRows are a batch's rows: closing them reads the COMMIT queued
// after them, if any, and closes the batch.
type batchRows struct {
	pgx.Rows
	t   *tenantTx
	br  pgx.BatchResults
	err error // of the COMMIT or the batch, once closed
}

func (r *batchRows) Close() {
	if r.br == nil {
		return
	}
	r.Rows.Close()
	if r.Rows.Err() == nil {
		r.err = r.t.readCommit(r.br)
	} else {
		_ = r.br.Close() // the statement's error is Err's
	}
	r.br = nil
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is a batch's row: scanning it reads the COMMIT queued after it,
// if any, and closes the batch.
type batchRow struct {
	row pgx.Row
	t   *tenantTx
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		_ = r.br.Close() // the statement's error is the one to report
		return err
	}
	// No row is an answer like any other (and is returned as itself, as
	// pgx returns it): the transaction goes on, or commits.
	if cerr := r.t.readCommit(r.br); cerr != nil {
		return cerr
	}
	return err
}

// errRow is a row that could not be read.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
