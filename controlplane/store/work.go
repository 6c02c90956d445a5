package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// WorkIDPrefix starts every work item's id.
const WorkIDPrefix = "work_"

// Work item states (migration 00075 draws their machine).
const (
	WorkQueued   = "queued"
	WorkStarting = "starting"
	WorkActive   = "active"
	WorkStopping = "stopping"
	WorkStopped  = "stopped"
)

// NoHeartbeat is the expected_last_heartbeat of a lease's first heartbeat.
const NoHeartbeat = "NO_HEARTBEAT"

// WorkItem is a unit of work of a self-hosted environment: a session whose
// built-in tools a worker on the tenant's own machine runs.
type WorkItem struct {
	ID              string
	EnvironmentID   string
	SessionID       string
	State           string
	Metadata        map[string]string
	WorkerID        string
	CreatedAt       time.Time
	PolledAt        *time.Time
	AcknowledgedAt  *time.Time
	StartedAt       *time.Time
	LatestHeartbeat *time.Time
	// LastHeartbeat is the lease's compare token ("" before the first).
	LastHeartbeat   string
	LeaseExpiresAt  *time.Time
	StopRequestedAt *time.Time
	StoppedAt       *time.Time
}

// Lease is a work item's lease as a heartbeat sees it.
type Lease struct {
	State         string
	LastHeartbeat string // "" when none was recorded
	Extended      bool
	TTL           time.Duration
}

// LeaseLostError is a heartbeat's answer when its expected_last_heartbeat
// is not the item's (another worker holds the lease, or it ran out and the
// item went back to the queue): the worker must let the item go.
type LeaseLostError struct {
	Expected string
	Current  Lease
}

func (e *LeaseLostError) Error() string {
	actual := e.Current.LastHeartbeat
	if actual == "" {
		actual = "NULL"
	}
	return "Heartbeat precondition failed: expected " + e.Expected + ", actual was " + actual
}

// WorkStats describes an environment's queue.
type WorkStats struct {
	Depth          int64 // queued, not handed out
	Pending        int64 // handed out by a poll, not acknowledged
	OldestQueuedAt *time.Time
	WorkersPolling int64 // workers that polled in the last 30s
}

// Work is the work queue of a tenant's self-hosted environments.
type Work struct{ s *Store }

// Work returns the work queue repository.
func (s *Store) Work() Work { return Work{s} }

// WorkChannel carries "<tenant id>:<environment id>" to every node when
// work is queued there (NOTIFY, sent on commit): each node's events hub
// hands it to WorkNotified, which wakes its long polls of that queue.
const WorkChannel = "corral_work"

// WorkNotified wakes this node's long polls of the queue a WorkChannel
// payload names.
func (s *Store) WorkNotified(payload string) {
	tid, env, ok := strings.Cut(payload, ":")
	if ok && tid != "" && env != "" {
		s.work.notify(tid, env)
	}
}

// notifyWork queues, in the caller's transaction, the notification that
// work was queued in tid's envID, for every node's polls.
func notifyWork(ctx context.Context, q *db.Queries, tid, envID string) error {
	return translate(q.NotifyWork(ctx, tid+":"+envID), "work notification")
}

// workSignal wakes this node's long polls when an environment's queue may
// have something for them: at once for what this node queued, and through
// WorkChannel for what any node did (a node without a listener, as in
// tests, is woken by its own enqueues only; its polls, at most a second
// long, see the rest when they ask again).
type workSignal struct {
	// mu guards waiting: per tenant and environment, a channel closed on
	// the next enqueue.
	mu      sync.Mutex
	waiting map[workKey]chan struct{}
}

type workKey struct{ tenant, env string }

// wait returns a channel closed when work is next queued in tid's envID.
func (w *workSignal) wait(tid, envID string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting == nil {
		w.waiting = map[workKey]chan struct{}{}
	}
	k := workKey{tid, envID}
	ch, ok := w.waiting[k]
	if !ok {
		ch = make(chan struct{})
		w.waiting[k] = ch
	}
	return ch
}

func (w *workSignal) notify(tid, envID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := workKey{tid, envID}
	if ch, ok := w.waiting[k]; ok {
		close(ch)
		delete(w.waiting, k)
	}
}

// QueueSession queues a work item for session sessionID, if it is a live
// self-hosted session without a live item; otherwise it does nothing.
func (r Work) QueueSession(ctx context.Context, sessionID string) error {
	var env string
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		n, err := q.EnqueueSessionWork(ctx, db.EnqueueSessionWorkParams{ID: newID(WorkIDPrefix), TenantID: tid, SessionID: sessionID})
		if err != nil || n == 0 {
			return translate(err, "work item")
		}
		s, err := q.GetSession(ctx, db.GetSessionParams{TenantID: tid, ID: sessionID})
		if err != nil {
			return translate(err, "session "+sessionID)
		}
		env = s.EnvironmentID
		return notifyWork(ctx, q, tid, env)
	})
	if err == nil && env != "" {
		r.notify(ctx, env)
	}
	return err
}

func (r Work) notify(ctx context.Context, envID string) {
	if tid, err := tenant.Required(ctx); err == nil {
		r.s.work.notify(string(tid), envID)
	}
}

// Poll hands out the oldest item of environment envID that no worker holds,
// waiting up to block for one: a queued item not handed out, or handed out
// longer than reclaim ago without an ack, or one whose lease ran out. It
// returns nil when none came. workerID (optional) is recorded for the
// queue's stats.
func (r Work) Poll(ctx context.Context, envID, workerID string, block, reclaim time.Duration) (*WorkItem, error) {
	deadline := time.Now().Add(block)
	for {
		tid, err := tenant.Required(ctx)
		if err != nil {
			return nil, err
		}
		// Wait on the signal taken before the look, so that an enqueue
		// between the look and the wait is not missed.
		wake := r.s.work.wait(string(tid), envID)
		item, err := r.claim(ctx, envID, workerID, reclaim)
		if err != nil || item != nil {
			return item, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		t := time.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
			return nil, nil
		case <-wake:
			t.Stop()
		}
	}
}

func (r Work) claim(ctx context.Context, envID, workerID string, reclaim time.Duration) (*WorkItem, error) {
	var out *WorkItem
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if workerID != "" {
			if err := sawWorker(ctx, q, tid, envID, workerID); err != nil {
				return err
			}
		}
		if err := q.EndStoppingWork(ctx, db.EndStoppingWorkParams{TenantID: tid, EnvironmentID: envID}); err != nil {
			return translate(err, "work items")
		}
		row, err := q.ClaimWork(ctx, db.ClaimWorkParams{TenantID: tid, EnvironmentID: envID, WorkerID: optText(workerID), ReclaimSeconds: reclaim.Seconds()})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return translate(err, "work item")
		}
		it, err := workFromRow(row)
		out = &it
		return err
	})
	return out, err
}

// maxWorkers bounds the workers an environment's stats keep track of.
const maxWorkers = 1000

// sawWorker records that workerID polled envID; a worker new to the
// environment first makes room by forgetting those idle for an hour.
func sawWorker(ctx context.Context, q *db.Queries, tid, envID, workerID string) error {
	n, err := q.TouchWorker(ctx, db.TouchWorkerParams{TenantID: tid, EnvironmentID: envID, WorkerID: workerID})
	if err != nil || n > 0 {
		return translate(err, "worker")
	}
	if err := q.ForgetIdleWorkers(ctx, db.ForgetIdleWorkersParams{TenantID: tid, EnvironmentID: envID}); err != nil {
		return translate(err, "workers")
	}
	return translate(q.AddWorker(ctx, db.AddWorkerParams{TenantID: tid, EnvironmentID: envID, WorkerID: workerID, MaxWorkers: maxWorkers}), "worker")
}

// Get returns work item id of environment envID.
func (r Work) Get(ctx context.Context, envID, id string) (WorkItem, error) {
	var out WorkItem
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetWork(ctx, db.GetWorkParams{TenantID: tid, EnvironmentID: envID, ID: id})
		if err != nil {
			return translate(err, "work item "+id)
		}
		out, err = workFromRow(row)
		return err
	})
	return out, err
}

// Ack confirms that a worker took item id, which a poll handed out: it
// leaves the queue (starting), with a lease of ttl until its first
// heartbeat. An item no poll handed out, or already acknowledged, is a
// conflict.
func (r Work) Ack(ctx context.Context, envID, id string, ttl time.Duration) (WorkItem, error) {
	return r.locked(ctx, envID, id, func(q *db.Queries, tid string, cur db.EnvironmentWork) (db.EnvironmentWork, error) {
		if cur.State != WorkQueued || !cur.PolledAt.Valid {
			return cur, errdefs.Conflict("work item %s is %s; only an item a poll handed out can be acknowledged", id, stateWord(cur))
		}
		return q.AckWork(ctx, db.AckWorkParams{TenantID: tid, ID: id, TtlSeconds: ttl.Seconds()})
	})
}

// Heartbeat extends item id's lease by ttl if expected is its last
// heartbeat (NoHeartbeat for the first), and returns the lease with its new
// token. A mismatch, or a lease that ran out (the item goes back to the
// queue), is a *LeaseLostError. An item stopping or stopped is not compared:
// its lease is not extended, and the worker is told its state.
func (r Work) Heartbeat(ctx context.Context, envID, id, expected string, ttl time.Duration) (Lease, error) {
	var lease Lease
	requeued := false
	_, err := r.locked(ctx, envID, id, func(q *db.Queries, tid string, cur db.EnvironmentWork) (db.EnvironmentWork, error) {
		current := Lease{State: cur.State, LastHeartbeat: cur.LastHeartbeat.String, TTL: ttl}
		switch cur.State {
		case WorkStopping, WorkStopped:
			lease = current
			return cur, nil
		case WorkQueued:
			return cur, &LeaseLostError{Expected: expected, Current: current}
		}
		if cur.LeaseExpiresAt.Valid && cur.LeaseExpiresAt.Time.Before(time.Now()) {
			// Ran out: back to the queue, for whoever polls next.
			if err := q.RequeueWork(ctx, db.RequeueWorkParams{TenantID: tid, ID: id}); err != nil {
				return cur, err
			}
			if err := notifyWork(ctx, q, tid, envID); err != nil {
				return cur, err
			}
			requeued = true
			return cur, &LeaseLostError{Expected: expected, Current: Lease{State: WorkQueued, TTL: ttl}}
		}
		matches := cur.LastHeartbeat.String == expected
		if expected == NoHeartbeat {
			matches = !cur.LastHeartbeat.Valid
		}
		if !matches {
			return cur, &LeaseLostError{Expected: expected, Current: current}
		}
		token := time.Now().UTC().Format(time.RFC3339Nano)
		if token == cur.LastHeartbeat.String {
			token += "~" // the clock did not move: the token must
		}
		row, err := q.HeartbeatWork(ctx, db.HeartbeatWorkParams{TenantID: tid, ID: id, Token: token, TtlSeconds: ttl.Seconds()})
		if err != nil {
			return cur, err
		}
		lease = Lease{State: row.State, LastHeartbeat: token, Extended: true, TTL: ttl}
		return row, nil
	})
	if requeued {
		r.notify(ctx, envID)
	}
	return lease, err
}

// Stop stops item id: at once with force (or when no worker holds it),
// otherwise gracefully (stopping: the holder's next heartbeat tells it to
// end, then it stops the item). An item already stopped is a conflict.
// When the item ends while its session still needs a worker (its turn
// runs, input waits, or a built-in tool call waits for its result), a new
// item is queued for another worker.
func (r Work) Stop(ctx context.Context, envID, id string, force bool) (WorkItem, error) {
	var session string
	it, err := r.locked(ctx, envID, id, func(q *db.Queries, tid string, cur db.EnvironmentWork) (db.EnvironmentWork, error) {
		if cur.State == WorkStopped {
			return cur, errdefs.Conflict("work item %s is already stopped", id)
		}
		state := WorkStopping
		if force || cur.State == WorkQueued {
			state = WorkStopped
		}
		row, err := q.SetWorkState(ctx, db.SetWorkStateParams{TenantID: tid, ID: id, State: state})
		if err != nil || state != WorkStopped {
			return row, err
		}
		needed, err := q.SessionNeedsWorker(ctx, db.SessionNeedsWorkerParams{TenantID: tid, ID: cur.SessionID})
		if err != nil {
			return row, err
		}
		if needed {
			session = cur.SessionID
		}
		return row, nil
	})
	if err == nil && session != "" {
		err = r.QueueSession(ctx, session)
	}
	return it, err
}

// SetMetadata merges patch into item id's metadata: a nil value deletes
// its key. At most maxKeys keys remain.
func (r Work) SetMetadata(ctx context.Context, envID, id string, patch map[string]*string, maxKeys int) (WorkItem, error) {
	return r.locked(ctx, envID, id, func(q *db.Queries, tid string, cur db.EnvironmentWork) (db.EnvironmentWork, error) {
		md, err := unmarshalMetadata(cur.Metadata)
		if err != nil {
			return cur, err
		}
		for k, v := range patch {
			if v == nil {
				delete(md, k)
			} else {
				md[k] = *v
			}
		}
		if len(md) > maxKeys {
			return cur, errdefs.InvalidArgument("metadata: at most %d keys (the patch leaves %d)", maxKeys, len(md))
		}
		return q.SetWorkMetadata(ctx, db.SetWorkMetadataParams{TenantID: tid, ID: id, Metadata: marshalMetadata(md)})
	})
}

// List returns up to limit of environment envID's items, newest first,
// after key when it is set; and whether more follow.
func (r Work) List(ctx context.Context, envID string, limit int, after *Key) ([]WorkItem, bool, error) {
	var out []WorkItem
	more := false
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		p := db.ListWorkParams{TenantID: tid, EnvironmentID: envID, Lim: int32(limit + 1)}
		if after != nil {
			p.AfterCreated = pgtype.Timestamptz{Time: after.CreatedAt, Valid: true}
			p.AfterID = after.ID
		}
		rows, err := q.ListWork(ctx, p)
		if err != nil {
			return translate(err, "work items")
		}
		if len(rows) > limit {
			rows, more = rows[:limit], true
		}
		for _, row := range rows {
			it, err := workFromRow(row)
			if err != nil {
				return err
			}
			out = append(out, it)
		}
		return nil
	})
	return out, more, err
}

// Stats describes environment envID's queue.
func (r Work) Stats(ctx context.Context, envID string) (WorkStats, error) {
	var out WorkStats
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if err := q.ForgetIdleWorkers(ctx, db.ForgetIdleWorkersParams{TenantID: tid, EnvironmentID: envID}); err != nil {
			return translate(err, "workers")
		}
		row, err := q.WorkStats(ctx, db.WorkStatsParams{TenantID: tid, EnvironmentID: envID})
		if err != nil {
			return translate(err, "work stats")
		}
		out = WorkStats{Depth: row.Depth, Pending: row.Pending, OldestQueuedAt: fromTS(row.OldestQueuedAt), WorkersPolling: row.WorkersPolling}
		return nil
	})
	return out, err
}

// locked runs fn over item id of envID under its row lock and returns the
// row fn returns. fn's errors pass through unchanged when they are
// classified, and are translated otherwise.
func (r Work) locked(ctx context.Context, envID, id string, fn func(q *db.Queries, tid string, cur db.EnvironmentWork) (db.EnvironmentWork, error)) (WorkItem, error) {
	var out WorkItem
	var kept error // a classified error that still commits (a requeue)
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		cur, err := q.LockWork(ctx, db.LockWorkParams{TenantID: tid, EnvironmentID: envID, ID: id})
		if err != nil {
			return translate(err, "work item "+id)
		}
		row, err := fn(q, tid, cur)
		var lost *LeaseLostError
		switch {
		case errors.As(err, &lost):
			kept = err
		case err != nil && errdefs.KindOf(err) != errdefs.Unknown:
			return err
		case err != nil:
			return translate(err, "work item "+id)
		}
		out, err = workFromRow(row)
		return err
	})
	if err == nil {
		err = kept
	}
	return out, err
}

// stateWord names a row's state for an error: a queued item a poll handed
// out is pending.
func stateWord(w db.EnvironmentWork) string {
	if w.State == WorkQueued && w.PolledAt.Valid {
		return "pending"
	}
	return w.State
}

func workFromRow(row db.EnvironmentWork) (WorkItem, error) {
	md, err := unmarshalMetadata(row.Metadata)
	if err != nil {
		return WorkItem{}, err
	}
	return WorkItem{
		ID: row.ID, EnvironmentID: row.EnvironmentID, SessionID: row.SessionID, State: row.State,
		Metadata: md, WorkerID: row.WorkerID.String, CreatedAt: row.CreatedAt.Time,
		PolledAt: fromTS(row.PolledAt), AcknowledgedAt: fromTS(row.AcknowledgedAt), StartedAt: fromTS(row.StartedAt),
		LatestHeartbeat: fromTS(row.LatestHeartbeatAt), LastHeartbeat: row.LastHeartbeat.String,
		LeaseExpiresAt: fromTS(row.LeaseExpiresAt), StopRequestedAt: fromTS(row.StopRequestedAt), StoppedAt: fromTS(row.StoppedAt),
	}, nil
}
