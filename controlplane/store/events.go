package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// EventsChannel is the PostgreSQL notification channel that announces
// appended events. Payloads are "<session id>:<last seq>" (or
// "<session id>:deleted"); listeners then read the events themselves, so a
// lost or coalesced notification loses nothing.
const EventsChannel = "corral_events"

// NewEvent is an event to append.
type NewEvent struct {
	ID   string
	Type string
	// Body is the event's JSON object, with id and type, without
	// processed_at.
	Body []byte
	// Queued marks a client event that waits for the agent loop
	// (processed_at stays NULL until the loop consumes it).
	Queued bool
	// Answers, for a user.tool_result, is the agent.tool_use it answers.
	// AppendClient checks under the session's lock that the session is
	// self-hosted and that the call has no result yet: a call gets one.
	Answers string

	// Private is a JSON object the agent loop keeps with the event and
	// reads back in StoredEvent.Private; the API never serves it. Nil:
	// none.
	Private []byte
}

// StoredEvent is an event as read back.
type StoredEvent struct {
	Seq         int64
	ID          string
	Type        string
	ProcessedAt *time.Time
	// JSON is the event as the API returns it, processed_at included.
	JSON []byte
	// Private is what the agent loop kept with the event (NewEvent.Private),
	// nil if nothing. Never part of what the API returns.
	Private []byte
}

// Append is one atomic change to a session's log.
type Append struct {
	// Consume marks these queued client events processed; each must be
	// queued, or the append fails.
	Consume []string
	Events  []NewEvent
	// Status, when set, becomes the session's status.
	Status string
	Usage  TokenUsage
	// RunnerEpoch, when non-zero, is the epoch of the session runner making
	// the append: unless it is the session's current runner epoch the
	// append is refused with ErrStaleRunner, in the same transaction.
	RunnerEpoch int64
}

// ErrStaleRunner is in the chain of an append or claim refused because a
// newer session runner has claimed the session. Its kind is
// errdefs.Conflict.
var ErrStaleRunner = errors.New("stale session runner")

// TokenUsage adds to a session's usage counters.
type TokenUsage struct {
	InputTokens, OutputTokens, CacheReadInputTokens int64
	// CacheCreationInputTokens count as 5-minute cache writes (the
	// default lifetime; the loop asks for no other).
	CacheCreationInputTokens int64
	// Model is the model the tokens went to: the usage report's
	// (usage_model_tokens) row is the session's, model's and hour's.
	Model string
}

// Events is the session event log.
type Events struct{ s *Store }

// Events returns the event log repository.
func (s *Store) Events() Events { return Events{s} }

// Append applies a to the session's log in one transaction: queued events
// consumed, new events appended with the next sequence numbers, the status
// and usage updated, and listeners notified on commit. It returns the
// session's last sequence number.
func (r Events) Append(ctx context.Context, sessionID string, a Append) (int64, error) {
	var last int64
	at := appendTime()
	err := r.s.inTenantTx(ctx, func(tx *tenantTx, q *db.Queries, tid string) error {
		if len(a.Consume) == 0 {
			// Most of the loop's commits: the lock, the epoch's check and
			// the append are one statement, the transaction one round trip.
			var err error
			last, _, err = r.appendEvents(ctx, tx.queryRowCommit, tid, sessionID, appendCheck{epoch: a.RunnerEpoch}, a.Events, a.Status, a.Usage, at)
			return err
		}
		row, err := q.LockSessionForAppend(ctx, db.LockSessionForAppendParams{TenantID: tid, ID: sessionID})
		if err != nil {
			return translate(err, "session "+sessionID)
		}
		if a.RunnerEpoch != 0 && a.RunnerEpoch != row.RunnerEpoch {
			return errdefs.Wrap(errdefs.ConflictKind, ErrStaleRunner, "session %s: runner epoch %d is not the current %d", sessionID, a.RunnerEpoch, row.RunnerEpoch)
		}
		n, err := q.MarkEventsProcessed(ctx, db.MarkEventsProcessedParams{TenantID: tid, SessionID: sessionID, Ids: a.Consume})
		if err != nil {
			return fmt.Errorf("consuming events: %w", err)
		}
		if int(n) != len(a.Consume) {
			return errdefs.Conflict("consuming %d queued events of session %s: only %d were queued", len(a.Consume), sessionID, n)
		}
		last, _, err = r.appendEvents(ctx, tx.queryRowCommit, tid, sessionID, appendCheck{}, a.Events, a.Status, a.Usage, at)
		return err
	})
	if err == nil && len(a.Events) > 0 {
		if observe := r.s.onAppend.Load(); observe != nil {
			(*observe)(sessionID, storedAppend(a.Events, last, at))
		}
	}
	return last, err
}

// AppendObserver is told of the events an Append committed, in order and
// as the API returns them (their JSON as built, not as the database gives
// it back: the same fields and values): this node's event streams write
// them without reading them back (events.Hub.Appended). It must not block.
type AppendObserver func(sessionID string, events []StoredEvent)

// ObserveAppends sets the observer of Append's commits (nil: none).
func (s *Store) ObserveAppends(f AppendObserver) {
	if f == nil {
		s.onAppend.Store(nil)
		return
	}
	s.onAppend.Store(&f)
}

// appendTime is an append's processed_at: microseconds, as the database
// keeps it, so that an event told to an AppendObserver reads the same as
// the stored one.
func appendTime() time.Time { return time.Now().Truncate(time.Microsecond) }

// storedAppend is events as stored by an Append that ended at sequence
// number last, at at.
func storedAppend(events []NewEvent, last int64, at time.Time) []StoredEvent {
	out := make([]StoredEvent, len(events))
	first := last - int64(len(events)) + 1
	for i, e := range events {
		var processed *time.Time
		if !e.Queued {
			processed = &at
		}
		out[i] = StoredEvent{Seq: first + int64(i), ID: e.ID, Type: e.Type, ProcessedAt: processed, JSON: withProcessedAt(e.Body, processed), Private: e.Private}
	}
	return out
}

// ClaimRunner records that the session's runner now has epoch: later
// appends with an older epoch are refused. Claiming an epoch older than the
// session's current one is refused with ErrStaleRunner; claiming the current
// one again succeeds.
func (r Events) ClaimRunner(ctx context.Context, sessionID string, epoch int64) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		cur, err := q.ClaimRunnerEpoch(ctx, db.ClaimRunnerEpochParams{TenantID: tid, ID: sessionID, Epoch: epoch})
		if err != nil {
			return translate(err, "session "+sessionID)
		}
		if cur != epoch {
			return errdefs.Wrap(errdefs.ConflictKind, ErrStaleRunner, "session %s: runner epoch %d is older than the claimed %d", sessionID, epoch, cur)
		}
		return nil
	})
}

// AppendClient appends events a client sent, queued for the agent loop, and
// returns them as stored. Archived and terminated sessions refuse them. A
// user.message to a self-hosted session queues its work item (Work) in the
// same statement, unless one is queued already: the input and the work
// that takes it are kept together. Without tool results to check, the
// transaction is that one statement, one round trip of the turn's path.
func (r Events) AppendClient(ctx context.Context, sessionID string, events []NewEvent) ([]StoredEvent, error) {
	var out []StoredEvent
	var queuedIn, tenantID string // the environment whose queue got an item
	check := appendCheck{open: true}
	if slices.ContainsFunc(events, func(e NewEvent) bool { return e.Type == "user.message" }) {
		check.workID = newID(WorkIDPrefix) // queued only if the session is self-hosted
	}
	answers := false
	for i := range events {
		events[i].Queued = true
		answers = answers || events[i].Answers != ""
	}
	err := r.s.inTenantTx(ctx, func(tx *tenantTx, q *db.Queries, tid string) error {
		if answers {
			// A tool result is checked against the log under the
			// session's row lock, before the append.
			row, err := q.LockSessionForAppend(ctx, db.LockSessionForAppendParams{TenantID: tid, ID: sessionID})
			if err != nil {
				return translate(err, "session "+sessionID)
			}
			if row.ArchivedAt.Valid {
				return errdefs.Conflict("session %s is archived and accepts no events", sessionID)
			}
			if row.Status == SessionTerminated {
				return errdefs.Conflict("session %s is terminated and accepts no events", sessionID)
			}
			for i, e := range events {
				if e.Answers != "" {
					if err := checkToolResult(ctx, tx, tid, sessionID, events[:i], e.Answers); err != nil {
						return err
					}
				}
			}
		}
		at := appendTime()
		last, env, err := r.appendEvents(ctx, tx.queryRowCommit, tid, sessionID, check, events, "", TokenUsage{}, at)
		if err != nil {
			return err
		}
		out = storedAppend(events, last, at) // queued: processed_at null
		if env != "" {
			queuedIn, tenantID = env, tid
		}
		return nil
	})
	if err == nil && queuedIn != "" {
		r.s.work.notify(tenantID, queuedIn)
	}
	return out, err
}

// checkToolResult refuses a user.tool_result for toolUseID unless the
// session (locked by the caller) is self-hosted and the call is a built-in
// tool call of the open turn without a result, in the log or among before
// (the events of the same request ahead of it).
func checkToolResult(ctx context.Context, tx db.DBTX, tid, sessionID string, before []NewEvent, toolUseID string) error {
	var selfHosted, isUse, answered, ended bool
	err := tx.QueryRow(ctx, `WITH u AS (SELECT seq FROM events WHERE tenant_id = $1 AND session_id = $2 AND id = $3 AND type = 'agent.tool_use')
	    SELECT s.self_hosted, EXISTS (SELECT 1 FROM u),
	        EXISTS (SELECT 1 FROM events r, u WHERE r.tenant_id = $1 AND r.session_id = $2 AND r.seq > u.seq
	                AND r.type IN ('user.tool_result', 'agent.tool_result') AND r.body->>'tool_use_id' = $3),
	        EXISTS (SELECT 1 FROM events i, u WHERE i.tenant_id = $1 AND i.session_id = $2 AND i.seq > u.seq
	                AND i.type = 'session.status_idle' AND i.body->'stop_reason'->>'type' <> 'requires_action')
	    FROM sessions s WHERE s.tenant_id = $1 AND s.id = $2`, tid, sessionID, toolUseID).Scan(&selfHosted, &isUse, &answered, &ended)
	if err != nil {
		return translate(err, "session "+sessionID)
	}
	for _, e := range before {
		answered = answered || e.Answers == toolUseID
	}
	switch {
	case !selfHosted:
		return errdefs.InvalidArgument("user.tool_result is accepted only in sessions of self_hosted environments: corral runs this session's tools itself")
	case !isUse:
		return errdefs.InvalidArgument("tool_use_id %s does not name an agent.tool_use of this session", toolUseID)
	case answered:
		return errdefs.Conflict("tool call %s already has its result", toolUseID)
	case ended:
		return errdefs.Conflict("the turn of tool call %s has ended (interrupted); its result is no longer taken", toolUseID)
	}
	return nil
}

// appendSQL appends events to a session, in one statement: it takes the
// session's row lock (which a caller that locked the row holds already),
// and unless a check fails, inserts the events numbered after the row's
// last sequence number, moves the row to its new last sequence number,
// status ($8; NULL keeps it) and usage, adds the model tokens to the
// tenant's day and the session's hour, and queues the notification that
// listeners receive on commit, so they never see a sequence number before
// its events are visible. The checks: $14, unless 0, is the runner epoch
// the append requires; $15 requires the session open (neither archived
// nor terminated). $16, unless empty, is the id of a work item to queue
// if the session is self-hosted and has no live one (the client's input
// and the work that takes it together), with its WorkChannel notification.
// It returns the row as it was (last sequence number, runner epoch,
// archived, status), how many notifications it queued (1: it appended)
// and the environment whose work it queued, if any. Like the generated
// queries, it names the tenant, $1, in every WHERE clause. (sqlc cannot
// express the multi-array unnest, so the SQL is here.)
const appendSQL = `
	WITH s AS (
		SELECT last_seq, runner_epoch, archived_at IS NOT NULL AS archived, status, self_hosted, environment_id
		FROM sessions WHERE tenant_id = $1 AND id = $2 FOR UPDATE
	), ok AS (
		SELECT last_seq FROM s
		WHERE ($14::bigint = 0 OR runner_epoch = $14::bigint)
		  AND NOT ($15::bool AND (archived OR status = 'terminated'))
	), inserted AS (
		INSERT INTO events (tenant_id, session_id, seq, id, type, body, processed_at, private)
		SELECT $1, $2, ok.last_seq + x.ord, x.id, x.type, x.body::jsonb, x.processed_at, x.private::jsonb
		FROM ok, unnest($3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[])
		    WITH ORDINALITY AS x(id, type, body, processed_at, private, ord)
	), tokens AS (
		-- The tenant's tokens of the day, for its model token quota.
		INSERT INTO tenant_token_usage (tenant_id, day, tokens)
		SELECT $1, (now() AT TIME ZONE 'UTC')::date, $9::bigint + $10::bigint FROM ok WHERE $9::bigint + $10::bigint > 0
		ON CONFLICT (tenant_id, day) DO UPDATE SET tokens = tenant_token_usage.tokens + EXCLUDED.tokens
	), metered AS (
		-- The session's tokens of the hour by model, for billing
		-- (usage.go).
		INSERT INTO usage_model_tokens AS u (tenant_id, session_id, model, hour,
		    input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens)
		SELECT $1, $2, $13::text, date_trunc('hour', now(), 'UTC'), $9, $10, $11, $12 FROM ok
		WHERE $9::bigint + $10::bigint + $11::bigint + $12::bigint > 0
		ON CONFLICT (tenant_id, hour, session_id, model) DO UPDATE SET
		    input_tokens = u.input_tokens + EXCLUDED.input_tokens,
		    output_tokens = u.output_tokens + EXCLUDED.output_tokens,
		    cache_read_input_tokens = u.cache_read_input_tokens + EXCLUDED.cache_read_input_tokens,
		    cache_creation_input_tokens = u.cache_creation_input_tokens + EXCLUDED.cache_creation_input_tokens
	), work AS (
		-- A self-hosted session's work item (store/work.go).
		INSERT INTO environment_work (tenant_id, id, environment_id, session_id)
		SELECT $1, $16::text, s.environment_id, $2 FROM s, ok WHERE $16::text <> '' AND s.self_hosted
		ON CONFLICT (tenant_id, session_id) WHERE state <> 'stopped' DO NOTHING
		RETURNING environment_id
	), work_notified AS (
		SELECT pg_notify('corral_work', $1 || ':' || work.environment_id) FROM work
	), advanced AS (
		UPDATE sessions
		SET last_seq = ok.last_seq + cardinality($3::text[]),
		    status = COALESCE($8::text, status),
		    -- A run ends when the status leaves running: its time
		    -- goes into active_seconds (the right-hand sides read
		    -- the row as it was).
		    active_seconds = active_seconds + CASE
		        WHEN running_since IS NOT NULL AND COALESCE($8::text, status) <> 'running'
		        THEN GREATEST(0, extract(epoch FROM now() - running_since)) ELSE 0 END,
		    running_since = CASE
		        WHEN COALESCE($8::text, status) = 'running' THEN COALESCE(running_since, now()) END,
		    input_tokens = input_tokens + $9,
		    output_tokens = output_tokens + $10,
		    cache_read_input_tokens = cache_read_input_tokens + $11,
		    cache_creation_5m_input_tokens = cache_creation_5m_input_tokens + $12,
		    updated_at = now()
		FROM ok
		WHERE sessions.tenant_id = $1 AND sessions.id = $2
		RETURNING sessions.id, sessions.last_seq
	), notified AS (
		SELECT pg_notify('corral_events', advanced.id || ':' || advanced.last_seq) FROM advanced
	)
	SELECT s.last_seq, s.runner_epoch, s.archived, s.status, (SELECT count(*) FROM notified),
	    COALESCE((SELECT environment_id FROM work WHERE (SELECT count(*) FROM work_notified) > 0), '')
	FROM s`

// appendCheck is what an append requires of its session (appendSQL).
type appendCheck struct {
	epoch  int64  // the runner's epoch, unless 0
	open   bool   // neither archived nor terminated (a client's input)
	workID string // queue this work item if the session is self-hosted
}

// rowQuery runs a statement of a transaction that returns one row.
type rowQuery func(ctx context.Context, sql string, args []any, dest ...any) error

// appendEvents appends events to the session (appendSQL) through query:
// the transaction's queryRow, or its queryRowCommit when the append is
// its last statement (one round trip with COMMIT, and with BEGIN too when
// it is also the first). An append whose check fails appends nothing and
// says why: another runner epoch (ErrStaleRunner), a closed session
// (Conflict). It returns the session's new last sequence number, and the
// environment whose work it queued ("" if none). at is the processed_at
// of the events not queued (appendTime).
func (r Events) appendEvents(ctx context.Context, query rowQuery, tid, sessionID string, check appendCheck, events []NewEvent, status string, u TokenUsage, at time.Time) (int64, string, error) {
	now := at
	ids := make([]string, len(events))
	types := make([]string, len(events))
	bodies := make([]string, len(events))
	privates := make([]*string, len(events))
	processed := make([]*time.Time, len(events))
	for i, e := range events {
		ids[i], types[i], bodies[i] = e.ID, e.Type, string(e.Body)
		if e.Private != nil {
			p := string(e.Private)
			privates[i] = &p
		}
		if !e.Queued {
			processed[i] = &now
		}
	}
	var st *string
	if status != "" {
		st = &status
	}
	var (
		was, epoch, appended int64
		archived             bool
		state, workEnv       string
	)
	err := query(ctx, appendSQL, []any{tid, sessionID, ids, types, bodies, processed, privates,
		st, u.InputTokens, u.OutputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens, u.Model,
		check.epoch, check.open, check.workID},
		&was, &epoch, &archived, &state, &appended, &workEnv)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, "", errdefs.NotFound("session %s not found", sessionID)
	case err != nil:
		return 0, "", translate(err, "events of session "+sessionID)
	case check.epoch != 0 && check.epoch != epoch:
		return 0, "", errdefs.Wrap(errdefs.ConflictKind, ErrStaleRunner, "session %s: runner epoch %d is not the current %d", sessionID, check.epoch, epoch)
	case check.open && archived:
		return 0, "", errdefs.Conflict("session %s is archived and accepts no events", sessionID)
	case check.open && state == SessionTerminated:
		return 0, "", errdefs.Conflict("session %s is terminated and accepts no events", sessionID)
	case appended != 1:
		return 0, "", fmt.Errorf("appending to session %s: the statement appended nothing", sessionID)
	}
	return was + int64(len(events)), workEnv, nil
}

// EventQuery selects events of one session.
type EventQuery struct {
	// After and Before bound the sequence numbers (exclusive); Before > 0
	// reads backwards, newest first.
	After, Before int64
	Types         []string
	// Compared with processed_at (created_at for queued events).
	CreatedGT, CreatedGTE, CreatedLT, CreatedLTE *time.Time
	Limit                                        int
	// SessionKnown skips the check that the session exists (a stream that
	// checked when it opened); an unknown session then lists nothing.
	SessionKnown bool
}

// List returns events of the session. An unknown session is not found.
func (r Events) List(ctx context.Context, sessionID string, eq EventQuery) ([]StoredEvent, error) {
	if eq.Limit <= 0 {
		eq.Limit = 1000
	}
	var out []StoredEvent
	plain := eq.Before == 0 && len(eq.Types) == 0 && eq.CreatedGT == nil && eq.CreatedGTE == nil && eq.CreatedLT == nil && eq.CreatedLTE == nil
	if plain && !eq.SessionKnown {
		// The loop's refresh, and a client's first page: the page and
		// whether the session exists, in one statement and one round trip.
		err := r.s.inTenantRead(ctx, func(q *db.Queries, tid string) error {
			rows, err := q.ListSessionEventsAfter(ctx, db.ListSessionEventsAfterParams{TenantID: tid, SessionID: sessionID, After: eq.After, Lim: int32(eq.Limit)})
			if err != nil {
				return translate(err, "events of session "+sessionID)
			}
			if len(rows) == 0 {
				return errdefs.NotFound("session %s not found", sessionID)
			}
			for _, row := range rows {
				if row.Seq == 0 { // the session, without events after After
					continue
				}
				var pt *time.Time
				if row.ProcessedAt.Valid {
					pt = &row.ProcessedAt.Time
				}
				out = append(out, StoredEvent{Seq: row.Seq, ID: row.ID, Type: row.Type, ProcessedAt: pt, JSON: withProcessedAt(row.Body, pt), Private: row.Private})
			}
			return nil
		})
		return out, err
	}
	in := r.s.inTenant
	if eq.SessionKnown {
		in = r.s.inTenantRead // the list alone: one round trip
	}
	err := in(ctx, func(q *db.Queries, tid string) error {
		if !eq.SessionKnown {
			if _, err := q.SessionLoopState(ctx, db.SessionLoopStateParams{TenantID: tid, ID: sessionID}); err != nil {
				return translate(err, "session "+sessionID)
			}
		}
		ts := func(t *time.Time) pgtype.Timestamptz {
			if t == nil {
				return pgtype.Timestamptz{}
			}
			return pgtype.Timestamptz{Time: *t, Valid: true}
		}
		var types []string
		if len(eq.Types) > 0 {
			types = eq.Types
		}
		add := func(seq int64, id, typ string, body []byte, p pgtype.Timestamptz, private []byte) {
			var pt *time.Time
			if p.Valid {
				pt = &p.Time
			}
			out = append(out, StoredEvent{Seq: seq, ID: id, Type: typ, ProcessedAt: pt, JSON: withProcessedAt(body, pt), Private: private})
		}
		if eq.Before > 0 {
			rows, err := q.ListEventsBefore(ctx, db.ListEventsBeforeParams{
				TenantID: tid, SessionID: sessionID, Before: eq.Before, Types: types,
				CreatedGt: ts(eq.CreatedGT), CreatedGte: ts(eq.CreatedGTE), CreatedLt: ts(eq.CreatedLT), CreatedLte: ts(eq.CreatedLTE),
				Lim: int32(eq.Limit),
			})
			for _, row := range rows {
				add(row.Seq, row.ID, row.Type, row.Body, row.ProcessedAt, row.Private)
			}
			return err
		}
		rows, err := q.ListEventsAfter(ctx, db.ListEventsAfterParams{
			TenantID: tid, SessionID: sessionID, After: eq.After, Types: types,
			CreatedGt: ts(eq.CreatedGT), CreatedGte: ts(eq.CreatedGTE), CreatedLt: ts(eq.CreatedLT), CreatedLte: ts(eq.CreatedLTE),
			Lim: int32(eq.Limit),
		})
		for _, row := range rows {
			add(row.Seq, row.ID, row.Type, row.Body, row.ProcessedAt, row.Private)
		}
		return err
	})
	return out, err
}

// Queued returns the session's client events that the agent loop has not
// consumed yet, oldest first: an index scan, however long the log. An
// unknown session has none.
func (r Events) Queued(ctx context.Context, sessionID string) ([]StoredEvent, error) {
	var out []StoredEvent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListQueuedEvents(ctx, db.ListQueuedEventsParams{TenantID: tid, SessionID: sessionID})
		for _, row := range rows {
			out = append(out, StoredEvent{Seq: row.Seq, ID: row.ID, Type: row.Type, JSON: withProcessedAt(row.Body, nil), Private: row.Private})
		}
		return translate(err, "queued events of session "+sessionID)
	})
	return out, err
}

// SeqOf returns the sequence number of an event of the session.
func (r Events) SeqOf(ctx context.Context, sessionID, eventID string) (int64, error) {
	var seq int64
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		seq, err = q.EventSeq(ctx, db.EventSeqParams{TenantID: tid, SessionID: sessionID, ID: eventID})
		return translate(err, "event "+eventID+" of session "+sessionID)
	})
	return seq, err
}

// LoopState is what the agent loop reads of a session besides its log.
type LoopState struct {
	Agent   []byte // the resolved agent snapshot (JSON)
	Status  string
	LastSeq int64
	// SelfHosted: a worker of the tenant's runs the built-in tools.
	SelfHosted bool
}

// LoopState returns the session's agent snapshot, status and last sequence
// number.
func (r Events) LoopState(ctx context.Context, sessionID string) (LoopState, error) {
	var st LoopState
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.SessionLoopState(ctx, db.SessionLoopStateParams{TenantID: tid, ID: sessionID})
		if err != nil {
			return translate(err, "session "+sessionID)
		}
		st = LoopState{Agent: row.Agent, Status: row.Status, LastSeq: row.LastSeq, SelfHosted: row.SelfHosted}
		return nil
	})
	return st, err
}

// TenantSession names a session and its tenant.
type TenantSession struct {
	Tenant    tenant.ID
	SessionID string
}

// SessionsNeedingRunner lists, across tenants, the sessions whose agent loop
// has work: running, or with queued client events. A node calls it at start
// to resume loops that a stop interrupted.
func (s *Store) SessionsNeedingRunner(ctx context.Context) ([]TenantSession, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, session_id FROM sessions_needing_runner()`)
	if err != nil {
		return nil, fmt.Errorf("listing sessions to resume: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TenantSession, error) {
		var ts TenantSession
		var t string
		err := row.Scan(&t, &ts.SessionID)
		ts.Tenant = tenant.ID(t)
		return ts, err
	})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("listing sessions to resume: %w", err)
	}
	return out, nil
}

// withProcessedAt adds processed_at to a stored body: the body is a JSON
// object, so the field goes before its closing brace.
func withProcessedAt(body []byte, at *time.Time) []byte {
	body = bytes.TrimRight(body, " \n\t")
	if len(body) < 2 || body[len(body)-1] != '}' {
		return body
	}
	val := []byte("null")
	if at != nil {
		val = strconv.AppendQuote(nil, at.UTC().Format(time.RFC3339Nano))
	}
	out := make([]byte, 0, len(body)+len(val)+18)
	out = append(out, body[:len(body)-1]...)
	if len(bytes.TrimSpace(body[1:len(body)-1])) > 0 {
		out = append(out, ',')
	}
	out = append(out, `"processed_at":`...)
	out = append(out, val...)
	return append(out, '}')
}
