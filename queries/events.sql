-- name: LockSessionForAppend :one
-- Takes the session's row lock for an append that must check or change
-- something first (events consumed, tool results checked): the append's
-- own statement (store/events.go appendSQL) then holds it already.
SELECT status, archived_at, runner_epoch FROM sessions WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: MarkEventsProcessed :execrows
UPDATE events SET processed_at = now()
WHERE tenant_id = $1 AND session_id = $2 AND id = ANY (sqlc.arg(ids)::text[]) AND processed_at IS NULL;

-- name: NotifyEvents :exec
SELECT pg_notify('corral_events', sqlc.arg(payload)::text);

-- name: ListEventsAfter :many
-- Events with seq > after, ascending, optionally of some types only.
SELECT seq, id, type, body, created_at, processed_at, private FROM events
WHERE tenant_id = sqlc.arg(tenant_id) AND session_id = sqlc.arg(session_id) AND seq > sqlc.arg(after)
  AND (sqlc.narg(types)::text[] IS NULL OR type = ANY (sqlc.narg(types)::text[]))
  AND (sqlc.narg(created_gt)::timestamptz IS NULL OR coalesce(processed_at, created_at) > sqlc.narg(created_gt))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR coalesce(processed_at, created_at) >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lt)::timestamptz IS NULL OR coalesce(processed_at, created_at) < sqlc.narg(created_lt))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR coalesce(processed_at, created_at) <= sqlc.narg(created_lte))
ORDER BY seq ASC
LIMIT sqlc.arg(lim);

-- name: ListSessionEventsAfter :many
-- A page of the session's events with seq > after, ascending, in one
-- statement that also says whether the session exists: no row, it does
-- not; one row without an event (seq 0), it has none after after.
SELECT COALESCE(e.seq, 0)::bigint AS seq, COALESCE(e.id, '')::text AS id, COALESCE(e.type, '')::text AS type,
    e.body, e.processed_at, e.private
FROM sessions s
LEFT JOIN LATERAL (
    SELECT seq, id, type, body, processed_at, private FROM events
    WHERE events.tenant_id = sqlc.arg(tenant_id) AND events.session_id = s.id AND events.seq > sqlc.arg(after)
    ORDER BY seq ASC
    LIMIT sqlc.arg(lim)
) e ON true
WHERE s.tenant_id = sqlc.arg(tenant_id) AND s.id = sqlc.arg(session_id)
ORDER BY e.seq ASC;

-- name: ListEventsBefore :many
-- Events with seq < before, descending.
SELECT seq, id, type, body, created_at, processed_at, private FROM events
WHERE tenant_id = sqlc.arg(tenant_id) AND session_id = sqlc.arg(session_id) AND seq < sqlc.arg(before)
  AND (sqlc.narg(types)::text[] IS NULL OR type = ANY (sqlc.narg(types)::text[]))
  AND (sqlc.narg(created_gt)::timestamptz IS NULL OR coalesce(processed_at, created_at) > sqlc.narg(created_gt))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR coalesce(processed_at, created_at) >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lt)::timestamptz IS NULL OR coalesce(processed_at, created_at) < sqlc.narg(created_lt))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR coalesce(processed_at, created_at) <= sqlc.narg(created_lte))
ORDER BY seq DESC
LIMIT sqlc.arg(lim);

-- name: ListQueuedEvents :many
-- Client events the loop has not consumed yet (the events_queued index),
-- ascending.
SELECT seq, id, type, body, created_at, processed_at, private FROM events
WHERE tenant_id = $1 AND session_id = $2 AND processed_at IS NULL
ORDER BY seq ASC;

-- name: EventSeq :one
SELECT seq FROM events WHERE tenant_id = $1 AND session_id = $2 AND id = $3;

-- name: SessionLoopState :one
SELECT agent, status, last_seq, archived_at, self_hosted FROM sessions WHERE tenant_id = $1 AND id = $2;

-- name: ClaimRunnerEpoch :one
-- Moves the session's runner epoch up to the claimed one, never down; the
-- caller compares the result with its claim.
UPDATE sessions SET runner_epoch = GREATEST(runner_epoch, sqlc.arg(epoch)::bigint)
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING runner_epoch;
