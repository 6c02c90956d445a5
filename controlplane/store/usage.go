package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Usage is the metering record for billing (migration 00110): sessions'
// model tokens by model and hour (added by Events.Append with the model
// request's events) and their sandboxes' running and paused intervals
// (opened and closed by controlplane/usage's meter).
type Usage struct{ s *Store }

// Usage returns the usage repository.
func (s *Store) Usage() Usage { return Usage{s} }

// Sandbox states a usage interval is in.
const (
	SandboxRunning = "running"
	SandboxPaused  = "paused"
)

// SandboxInterval is an open interval of a session's sandbox.
type SandboxInterval struct {
	Tenant    tenant.ID
	SessionID string
	// State is SandboxRunning or SandboxPaused.
	State  string
	HostID string
	Since  time.Time
}

// ErrStaleMeter is in the chain of a meter's write or claim refused
// because a leader of a later Raft term has claimed the meter. Its kind
// is errdefs.Conflict.
var ErrStaleMeter = errors.New("stale usage meter")

// fenceMeter takes the meter's row lock in tx and refuses a term older
// than the last one claimed.
func fenceMeter(ctx context.Context, tx db.DBTX, term uint64, claim bool) error {
	q := `SELECT 1 FROM usage_meter WHERE term = $1 FOR UPDATE`
	if claim {
		q = `UPDATE usage_meter SET term = $1 WHERE term <= $1 RETURNING 1`
	}
	var one int
	err := tx.QueryRow(ctx, q, int64(term)).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return errdefs.Wrap(errdefs.ConflictKind, ErrStaleMeter, "usage meter of term %d: a later leader meters", term)
	}
	return err
}

// ClaimMeter records that the leader of term meters from now on, and
// returns every tenant's open intervals as of the claim. An older term's
// claim is refused with ErrStaleMeter.
func (r Usage) ClaimMeter(ctx context.Context, term uint64) ([]SandboxInterval, error) {
	var out []SandboxInterval
	err := pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
		if err := fenceMeter(ctx, tx, term, true); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT tenant_id, session_id, state, host_id, started_at FROM open_sandbox_intervals()`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanInterval)
		return err
	})
	if err != nil && !errors.Is(err, ErrStaleMeter) {
		return nil, unavailable(fmt.Errorf("claiming the usage meter: %w", err))
	}
	return out, err
}

// SetSandboxState records, for the meter of term (ClaimMeter), that the
// session's sandbox (ctx carries its tenant) is in state on host from at
// on: an open interval in another state or on another host closes at at,
// and one in this state opens unless it is open already. State "" closes
// the open one. Repeating a call changes nothing, so a new leader may
// replay what it sees; a term no longer the meter's is refused with
// ErrStaleMeter.
func (r Usage) SetSandboxState(ctx context.Context, term uint64, sessionID, state, hostID string, at time.Time) error {
	if state != "" && state != SandboxRunning && state != SandboxPaused {
		return errdefs.InvalidArgument("sandbox state %q", state)
	}
	return r.s.inTenantTx(ctx, func(tx *tenantTx, _ *db.Queries, tid string) error {
		if err := fenceMeter(ctx, tx, term, false); err != nil {
			return err
		}
		// Two statements: a CTE's update and an insert would see the
		// same snapshot, and the open-interval index would refuse the
		// new row.
		_, err := tx.Exec(ctx, `
			UPDATE usage_sandbox_intervals SET ended_at = GREATEST(started_at, $5::timestamptz)
			WHERE tenant_id = $1 AND session_id = $2 AND ended_at IS NULL
			  AND ($3::text = '' OR state <> $3::text OR host_id <> $4::text)`,
			tid, sessionID, state, hostID, at)
		if err == nil && state != "" {
			_, err = tx.Exec(ctx, `
				INSERT INTO usage_sandbox_intervals (tenant_id, session_id, state, host_id, started_at)
				VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (tenant_id, session_id) WHERE ended_at IS NULL DO NOTHING`,
				tid, sessionID, state, hostID, at)
		}
		if err != nil {
			return translate(err, "usage of session "+sessionID)
		}
		return nil
	})
}

// OpenSandboxIntervals returns every tenant's open intervals.
func (r Usage) OpenSandboxIntervals(ctx context.Context) ([]SandboxInterval, error) {
	rows, err := r.s.pool.Query(ctx, `SELECT tenant_id, session_id, state, host_id, started_at FROM open_sandbox_intervals()`)
	if err != nil {
		return nil, unavailable(fmt.Errorf("reading open sandbox intervals: %w", err))
	}
	return pgx.CollectRows(rows, scanInterval)
}

func scanInterval(row pgx.CollectableRow) (SandboxInterval, error) {
	var i SandboxInterval
	var t string
	err := row.Scan(&t, &i.SessionID, &i.State, &i.HostID, &i.Since)
	i.Tenant = tenant.ID(t)
	return i, err
}

// Granularities of a usage report.
const (
	UsageHour = "hour"
	UsageDay  = "day"
)

// UsageQuery selects a usage report's rows.
type UsageQuery struct {
	// Start and End bound the report, [Start, End): tokens are kept by
	// hour, so callers give whole hours.
	Start, End time.Time
	// Unit is UsageHour or UsageDay (UTC).
	Unit string
	// Now closes the intervals still open.
	Now time.Time
	// Offset rows are skipped, then at most Limit returned.
	Offset, Limit int
}

// UsageRow is one row of a usage report: a session's tokens of one model
// (Model set), or its sandbox's seconds (Model ""), within one bucket.
type UsageRow struct {
	Bucket    time.Time
	Tenant    tenant.ID
	SessionID string
	Model     string

	InputTokens, OutputTokens, CacheReadInputTokens, CacheCreationInputTokens int64
	RunningSeconds, PausedSeconds                                             float64
}

const usageColumns = `bucket, tenant_id, session_id, model, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, running_seconds, paused_seconds`

// Report returns the usage of the tenant in ctx, in bucket, session and
// model order.
func (r Usage) Report(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	var out []UsageRow
	err := r.s.inTenantTx(ctx, func(tx *tenantTx, _ *db.Queries, tid string) error {
		rows, err := tx.Query(ctx, `SELECT `+usageColumns+` FROM usage_rows($1, $2, $3, $4, $5)
			ORDER BY bucket, tenant_id, session_id, model OFFSET $6 LIMIT $7`,
			tid, q.Start, q.End, q.Unit, q.Now, q.Offset, q.Limit)
		if err != nil {
			return translate(err, "usage")
		}
		out, err = pgx.CollectRows(rows, scanUsage)
		return err
	})
	return out, err
}

// ReportAll is Report over every tenant, or only one when only is set:
// operators' view.
func (r Usage) ReportAll(ctx context.Context, only tenant.ID, q UsageQuery) ([]UsageRow, error) {
	rows, err := r.s.pool.Query(ctx, `SELECT `+usageColumns+` FROM usage_rows_all($1, $2, $3, $4, $5)
		ORDER BY bucket, tenant_id, session_id, model OFFSET $6 LIMIT $7`,
		optText(string(only)), q.Start, q.End, q.Unit, q.Now, q.Offset, q.Limit)
	if err != nil {
		return nil, unavailable(fmt.Errorf("reading usage: %w", err))
	}
	return pgx.CollectRows(rows, scanUsage)
}

func scanUsage(row pgx.CollectableRow) (UsageRow, error) {
	var u UsageRow
	var t string
	err := row.Scan(&u.Bucket, &t, &u.SessionID, &u.Model, &u.InputTokens, &u.OutputTokens,
		&u.CacheReadInputTokens, &u.CacheCreationInputTokens, &u.RunningSeconds, &u.PausedSeconds)
	u.Tenant = tenant.ID(t)
	return u, err
}
