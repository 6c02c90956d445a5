package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
)

// Session statuses.
const (
	SessionIdle         = "idle"
	SessionRunning      = "running"
	SessionRescheduling = "rescheduling"
	SessionTerminated   = "terminated"
)

// Session is a run of an agent in an environment.
type Session struct {
	ID     string
	Status string
	// AgentID and AgentVersion name the agent version the session was
	// created from; Agent is the resolved snapshot the session runs (the
	// API's form; the store does not look inside).
	AgentID       string
	AgentVersion  int64
	Agent         json.RawMessage
	EnvironmentID string
	// SandboxClass is the session's sandbox class (policy classes.yaml),
	// fixed at creation; empty in a session created before classes.
	SandboxClass string
	// PackageBuild is the key of the environment package build
	// (store.Builds) whose image the session's sandbox runs, fixed at
	// create; "" runs its class's image.
	PackageBuild string
	// SelfHosted is set when the session's environment is self_hosted
	// (fixed at creation): a worker of the tenant's runs its built-in
	// tools, and a work item is queued for it with the session.
	SelfHosted    bool
	Title         *string
	Metadata      map[string]string
	Resources     json.RawMessage
	VaultIDs      []string
	ActiveSeconds float64
	Usage         SessionUsage
	// BudgetCents is the session's budget, its max list cost in US cents
	// (nil: none).
	BudgetCents *int64
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ArchivedAt  *time.Time
}

// SessionUsage is a session's cumulative token usage.
type SessionUsage struct {
	InputTokens                int64
	OutputTokens               int64
	CacheReadInputTokens       int64
	CacheCreation5mInputTokens int64
	CacheCreation1hInputTokens int64
}

// SessionListOptions filter and page Sessions.List.
type SessionListOptions struct {
	AgentID         *string
	AgentVersion    *int64
	Created         TimeRange
	IncludeArchived bool
	Statuses        []string
	Limit           int
	// Key, when set, starts the page strictly after it in the direction of
	// the listing.
	Key *Key
	// Ascending lists oldest first; otherwise newest first.
	Ascending bool
}

// Sessions stores a tenant's sessions.
type Sessions struct{ s *Store }

// Sessions returns the session repository.
func (s *Store) Sessions() Sessions { return Sessions{s} }

// Create stores s under a new id, idle. The agent version and environment
// must exist (else a failed precondition), and so must every vault of
// s.VaultIDs, not archived (else invalid argument).
func (r Sessions) Create(ctx context.Context, s Session) (Session, error) {
	var out Session
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		out, err = r.insert(ctx, q, tid, s)
		return err
	})
	return out, err
}

// insert checks tenant tid's session quota and stores s, idle, under a new
// id, in the caller's transaction.
func (r Sessions) insert(ctx context.Context, q *db.Queries, tid string, s Session) (Session, error) {
	if s.VaultIDs == nil {
		s.VaultIDs = []string{}
	}
	vaults, _ := json.Marshal(s.VaultIDs)
	if err := r.s.checkSessionQuota(ctx, q, tid); err != nil {
		return Session{}, err
	}
	if err := checkVaults(ctx, q, tid, s.VaultIDs); err != nil {
		return Session{}, err
	}
	row, err := q.CreateSession(ctx, db.CreateSessionParams{
		TenantID:      tid,
		ID:            newID(SessionIDPrefix),
		AgentID:       s.AgentID,
		AgentVersion:  s.AgentVersion,
		Agent:         orEmptyJSON(s.Agent, "{}"),
		EnvironmentID: s.EnvironmentID,
		Title:         text(s.Title),
		Metadata:      marshalMetadata(s.Metadata),
		Resources:     orEmptyJSON(s.Resources, "[]"),
		VaultIds:      vaults,
		SandboxClass:  s.SandboxClass,
		PackageBuild:  s.PackageBuild,
		SelfHosted:    s.SelfHosted,
		BudgetCents:   pgInt8(s.BudgetCents),
	})
	if err != nil {
		return Session{}, translate(err, "session")
	}
	if s.SelfHosted {
		if _, err := q.EnqueueSessionWork(ctx, db.EnqueueSessionWorkParams{ID: newID(WorkIDPrefix), TenantID: tid, SessionID: row.ID}); err != nil {
			return Session{}, translate(err, "work item")
		}
		if err := notifyWork(ctx, q, tid, row.EnvironmentID); err != nil {
			return Session{}, err
		}
	}
	return sessionFromRow(row)
}

// CreateFrom stores a new session from version (0: the latest) of agent
// agentID in environment envID, in one transaction: build receives the agent
// version and the environment as they are in that transaction and returns
// the session to store (agent snapshot, title, metadata); its agent and
// environment ids are filled in.
func (r Sessions) CreateFrom(ctx context.Context, agentID string, version int64, envID string, build func(Agent, Environment) (Session, error)) (Session, error) {
	var out Session
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		out, err = r.createIn(ctx, q, tid, agentID, version, envID, build)
		return err
	})
	if err == nil && out.SelfHosted {
		Work(r).notify(ctx, out.EnvironmentID)
	}
	return out, err
}

// createIn is CreateFrom in a tenant's transaction.
func (r Sessions) createIn(ctx context.Context, q *db.Queries, tid, agentID string, version int64, envID string, build func(Agent, Environment) (Session, error)) (Session, error) {
	a, err := getAgent(ctx, q, tid, agentID, version)
	if err != nil {
		return Session{}, err
	}
	erow, err := q.GetEnvironment(ctx, db.GetEnvironmentParams{TenantID: tid, ID: envID})
	if err != nil {
		return Session{}, translate(err, "environment "+envID)
	}
	env, err := environmentFromRow(erow)
	if err != nil {
		return Session{}, err
	}
	s, err := build(a, env)
	if err != nil {
		return Session{}, err
	}
	s.AgentID, s.AgentVersion, s.EnvironmentID = a.ID, a.Version, env.ID
	return r.insert(ctx, q, tid, s)
}

// Once says how a create is made safe to repeat (CreateOnce).
type Once struct {
	// Key is the caller's idempotency key; empty: none.
	Key string
	// Request is the digest of the request (its principal and body).
	Request [32]byte
	// RetryOf, without a Key, marks the request as a client's automatic
	// retry of an earlier one: it gets the session that a request with
	// the same digest made within RetryOf, if one did. Zero: a new
	// request, never matched.
	RetryOf time.Duration
}

// CreateOnce is CreateFrom made safe to repeat: a request under a Key
// already used gets that key's session (existing true), or a Conflict if
// the request differs; a retry (RetryOf) gets the session its original
// made. Two concurrent requests under one key make one session.
func (r Sessions) CreateOnce(ctx context.Context, once Once, agentID string, version int64, envID string, build func(Agent, Environment) (Session, error)) (s Session, existing bool, err error) {
	for attempt := 0; ; attempt++ {
		s, existing, err = r.createOnce(ctx, once, agentID, version, envID, build)
		var pgErr *pgconn.PgError
		if attempt == 0 && once.Key != "" && errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "session_requests_key" {
			continue // a concurrent request took the key: read its session
		}
		if err == nil && !existing && s.SelfHosted {
			Work(r).notify(ctx, s.EnvironmentID)
		}
		return s, existing, err
	}
}

func (r Sessions) createOnce(ctx context.Context, once Once, agentID string, version int64, envID string, build func(Agent, Environment) (Session, error)) (Session, bool, error) {
	var (
		out      Session
		existing bool
	)
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		prior := ""
		switch {
		case once.Key != "":
			row, err := q.SessionRequestByKey(ctx, db.SessionRequestByKeyParams{TenantID: tid, IdempotencyKey: pgtype.Text{String: once.Key, Valid: true}})
			if err == nil {
				if !bytes.Equal(row.RequestSha256, once.Request[:]) {
					return errdefs.Conflict("the idempotency key was used for a different request (it made session %s)", row.SessionID)
				}
				prior = row.SessionID
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return translate(err, "session request")
			}
		case once.RetryOf > 0:
			id, err := q.RecentSessionRequest(ctx, db.RecentSessionRequestParams{TenantID: tid, RequestSha256: once.Request[:], WithinSeconds: once.RetryOf.Seconds()})
			if err == nil {
				prior = id
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return translate(err, "session request")
			}
		}
		if prior != "" {
			row, err := q.GetSession(ctx, db.GetSessionParams{TenantID: tid, ID: prior})
			if err != nil {
				return translate(err, "session "+prior)
			}
			existing = true
			out, err = sessionFromRow(row)
			return err
		}
		var err error
		if out, err = r.createIn(ctx, q, tid, agentID, version, envID, build); err != nil {
			return err
		}
		key := pgtype.Text{String: once.Key, Valid: once.Key != ""}
		// Not translated: CreateOnce tells a concurrent key from it.
		return q.CreateSessionRequest(ctx, db.CreateSessionRequestParams{TenantID: tid, SessionID: out.ID, IdempotencyKey: key, RequestSha256: once.Request[:]})
	})
	return out, existing, err
}

// Get returns session id.
func (r Sessions) Get(ctx context.Context, id string) (Session, error) {
	var out Session
	err := r.s.inTenantRead(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetSession(ctx, db.GetSessionParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "session "+id)
		}
		out, err = sessionFromRow(row)
		return err
	})
	return out, err
}

// Update stores the title, metadata and agent snapshot that apply returns
// for session id; apply runs under the row lock and sees the current status.
// The events apply returns (session.updated) are appended to the session's
// log in the same transaction. Archived sessions are read-only.
func (r Sessions) Update(ctx context.Context, id string, apply func(cur Session) (Session, []NewEvent, error)) (Session, error) {
	var out Session
	err := r.s.inTenantTx(ctx, func(tx *tenantTx, q *db.Queries, tid string) error {
		row, err := q.LockSession(ctx, db.LockSessionParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "session "+id)
		}
		cur, err := sessionFromRow(row)
		if err != nil {
			return err
		}
		if cur.ArchivedAt != nil {
			return errdefs.FailedPrecondition("session %s is archived and cannot be updated", id)
		}
		next, events, err := apply(cur)
		if err != nil {
			return err
		}
		updated, err := q.UpdateSession(ctx, db.UpdateSessionParams{
			TenantID: tid,
			ID:       id,
			Title:    text(next.Title),
			Metadata: marshalMetadata(next.Metadata),
			Agent:    orEmptyJSON(next.Agent, "{}"),
			// The budget changes only as the API's rules allow
			// (publicapi); the store keeps what it is given.
			BudgetCents: pgInt8(next.BudgetCents),
		})
		if err != nil {
			return translate(err, "session "+id)
		}
		if len(events) > 0 {
			if _, _, err := r.s.Events().appendEvents(ctx, tx.queryRow, tid, id, appendCheck{}, events, "", TokenUsage{}, appendTime()); err != nil {
				return err
			}
		}
		out, err = sessionFromRow(updated)
		return err
	})
	return out, err
}

// SetResources replaces session id's resources (the wire objects of its
// mounted files, as a JSON array) with what apply makes of the current
// ones, under the session's row lock so that concurrent adds and deletes
// take turns. An archived session's resources do not change.
func (r Sessions) SetResources(ctx context.Context, id string, apply func(cur Session) (json.RawMessage, error)) (Session, error) {
	var out Session
	err := r.s.inTenantTx(ctx, func(_ *tenantTx, q *db.Queries, tid string) error {
		row, err := q.LockSession(ctx, db.LockSessionParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "session "+id)
		}
		cur, err := sessionFromRow(row)
		if err != nil {
			return err
		}
		if cur.ArchivedAt != nil {
			return errdefs.FailedPrecondition("session %s is archived; its resources cannot change", id)
		}
		next, err := apply(cur)
		if err != nil {
			return err
		}
		updated, err := q.SetSessionResources(ctx, db.SetSessionResourcesParams{TenantID: tid, ID: id, Resources: orEmptyJSON(next, "[]")})
		if err != nil {
			return translate(err, "session "+id)
		}
		out, err = sessionFromRow(updated)
		return err
	})
	return out, err
}

// Archive makes session id read-only; archiving twice is a no-op. A running
// session cannot be archived (invalid argument, as the API reports it).
func (r Sessions) Archive(ctx context.Context, id string) (Session, error) {
	var out Session
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.LockSession(ctx, db.LockSessionParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "session "+id)
		}
		if row.Status == SessionRunning {
			return errdefs.InvalidArgument("cannot archive session %s while it is running; interrupt it and wait for it to go idle", id)
		}
		row, err = q.ArchiveSession(ctx, db.ArchiveSessionParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "session "+id)
		}
		out, err = sessionFromRow(row)
		return err
	})
	return out, err
}

// Delete removes session id (and, through the schema, everything that
// belongs to it). A running session cannot be deleted.
func (r Sessions) Delete(ctx context.Context, id string) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.LockSession(ctx, db.LockSessionParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "session "+id)
		}
		if row.Status == SessionRunning {
			return errdefs.InvalidArgument("cannot delete session %s while it is running; interrupt it and wait for it to go idle", id)
		}
		if _, err := q.DeleteSession(ctx, db.DeleteSessionParams{TenantID: tid, ID: id}); err != nil {
			return translate(err, "session "+id)
		}
		// Ends every open stream of the session, on every node, on commit.
		return q.NotifyEvents(ctx, id+":deleted")
	})
}

// List returns one page of the tenant's sessions in the direction opts asks
// for, and whether more follow in that direction.
func (r Sessions) List(ctx context.Context, opts SessionListOptions) ([]Session, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.Key)
	var agentID pgtype.Text
	if opts.AgentID != nil {
		agentID = pgtype.Text{String: *opts.AgentID, Valid: true}
	}
	var agentVersion pgtype.Int8
	if opts.AgentVersion != nil {
		agentVersion = pgtype.Int8{Int64: *opts.AgentVersion, Valid: true}
	}
	var statuses []string
	if len(opts.Statuses) > 0 {
		statuses = slices.Clone(opts.Statuses)
	}
	var rows []db.Session
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		if opts.Ascending {
			rows, err = q.ListSessionsAfter(ctx, db.ListSessionsAfterParams{
				TenantID: tid, AgentID: agentID, AgentVersion: agentVersion,
				CreatedGt: ts(opts.Created.Gt), CreatedGte: ts(opts.Created.Gte),
				CreatedLt: ts(opts.Created.Lt), CreatedLte: ts(opts.Created.Lte),
				IncludeArchived: opts.IncludeArchived, Statuses: statuses,
				KeyCreated: kc, KeyID: kid, Lim: lim,
			})
		} else {
			rows, err = q.ListSessionsBefore(ctx, db.ListSessionsBeforeParams{
				TenantID: tid, AgentID: agentID, AgentVersion: agentVersion,
				CreatedGt: ts(opts.Created.Gt), CreatedGte: ts(opts.Created.Gte),
				CreatedLt: ts(opts.Created.Lt), CreatedLte: ts(opts.Created.Lte),
				IncludeArchived: opts.IncludeArchived, Statuses: statuses,
				KeyCreated: kc, KeyID: kid, Lim: lim,
			})
		}
		return translate(err, "sessions")
	})
	if err != nil {
		return nil, false, err
	}
	more := len(rows) > n
	if more {
		rows = rows[:n]
	}
	out := make([]Session, 0, len(rows))
	for _, row := range rows {
		s, err := sessionFromRow(row)
		if err != nil {
			return nil, false, err
		}
		out = append(out, s)
	}
	return out, more, nil
}

// activeSeconds is the time the session has spent running: its ended runs,
// and the one under way.
func activeSeconds(row db.Session) float64 {
	if !row.RunningSince.Valid {
		return row.ActiveSeconds
	}
	return row.ActiveSeconds + max(0, time.Since(row.RunningSince.Time).Seconds())
}

func sessionFromRow(row db.Session) (Session, error) {
	md, err := unmarshalMetadata(row.Metadata)
	if err != nil {
		return Session{}, err
	}
	vaults := []string{}
	if len(row.VaultIds) > 0 {
		if err := json.Unmarshal(row.VaultIds, &vaults); err != nil {
			return Session{}, fmt.Errorf("decoding stored vault ids: %w", err)
		}
	}
	return Session{
		ID:            row.ID,
		Status:        row.Status,
		AgentID:       row.AgentID,
		AgentVersion:  row.AgentVersion,
		Agent:         json.RawMessage(row.Agent),
		EnvironmentID: row.EnvironmentID,
		SandboxClass:  row.SandboxClass,
		PackageBuild:  row.PackageBuild,
		SelfHosted:    row.SelfHosted,
		Title:         fromText(row.Title),
		Metadata:      md,
		Resources:     json.RawMessage(row.Resources),
		VaultIDs:      vaults,
		ActiveSeconds: activeSeconds(row),
		Usage: SessionUsage{
			InputTokens:                row.InputTokens,
			OutputTokens:               row.OutputTokens,
			CacheReadInputTokens:       row.CacheReadInputTokens,
			CacheCreation5mInputTokens: row.CacheCreation5mInputTokens,
			CacheCreation1hInputTokens: row.CacheCreation1hInputTokens,
		},
		BudgetCents: p8(row.BudgetCents),
		CreatedAt:   row.CreatedAt.Time,
		UpdatedAt:   row.UpdatedAt.Time,
		ArchivedAt:  fromTS(row.ArchivedAt),
	}, nil
}

// checkSessionQuota refuses a new session when the tenant already has as
// many live (neither archived nor terminated) sessions as its limit: its
// override, else Options.DefaultConcurrentSessions (0: no limit). A
// per-tenant advisory lock held to the end of the transaction makes
// concurrent creates take turns, so the count cannot race.
func (s *Store) checkSessionQuota(ctx context.Context, q *db.Queries, tid string) error {
	if err := q.LockTenantSessions(ctx, tid); err != nil {
		return translate(err, "session quota")
	}
	limit := int64(s.defaultSessions)
	if o, err := q.GetSessionLimit(ctx, tid); err == nil && o.Valid {
		limit = int64(o.Int32)
	} else if err != nil && !errdefs.IsNotFound(translate(err, "")) {
		return translate(err, "session quota")
	}
	if limit <= 0 {
		return nil
	}
	n, err := q.CountLiveSessions(ctx, tid)
	if err != nil {
		return translate(err, "session quota")
	}
	if n >= limit {
		return errdefs.ResourceExhausted("tenant %s has %d live sessions, its limit; archive or delete one first", tid, n)
	}
	return nil
}
