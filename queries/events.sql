-- name: LockSessionForAppend :one
-- Serializes appends to one session: the caller holds the row lock until
-- commit, so sequence numbers are dense and ordered.
SELECT status, last_seq, archived_at FROM sessions WHERE id = $1 FOR UPDATE;

-- name: MarkEventsProcessed :execrows
UPDATE events SET processed_at = now()
WHERE session_id = $1 AND id = ANY (sqlc.arg(ids)::text[]) AND processed_at IS NULL;

-- name: AdvanceSession :exec
-- Moves the session to its new last sequence number and status, and queues
-- the notification that listeners receive on commit.
WITH advanced AS (
    UPDATE sessions
    SET last_seq = sqlc.arg(last_seq),
        status = COALESCE(sqlc.narg(status)::text, status),
        input_tokens = input_tokens + sqlc.arg(input_tokens),
        output_tokens = output_tokens + sqlc.arg(output_tokens),
        cache_read_input_tokens = cache_read_input_tokens + sqlc.arg(cache_read_input_tokens),
        updated_at = now()
    WHERE id = sqlc.arg(id)
    RETURNING id, last_seq
)
SELECT pg_notify('corral_events', advanced.id || ':' || advanced.last_seq) FROM advanced;

-- name: NotifyEvents :exec
SELECT pg_notify('corral_events', sqlc.arg(payload)::text);

-- name: ListEventsAfter :many
-- Events with seq > after, ascending, optionally of some types only.
SELECT seq, id, type, body, created_at, processed_at FROM events
WHERE session_id = $1 AND seq > sqlc.arg(after)
  AND (sqlc.narg(types)::text[] IS NULL OR type = ANY (sqlc.narg(types)::text[]))
  AND (sqlc.narg(created_gt)::timestamptz IS NULL OR coalesce(processed_at, created_at) > sqlc.narg(created_gt))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR coalesce(processed_at, created_at) >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lt)::timestamptz IS NULL OR coalesce(processed_at, created_at) < sqlc.narg(created_lt))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR coalesce(processed_at, created_at) <= sqlc.narg(created_lte))
ORDER BY seq ASC
LIMIT sqlc.arg(lim);

-- name: ListEventsBefore :many
-- Events with seq < before, descending.
SELECT seq, id, type, body, created_at, processed_at FROM events
WHERE session_id = $1 AND seq < sqlc.arg(before)
  AND (sqlc.narg(types)::text[] IS NULL OR type = ANY (sqlc.narg(types)::text[]))
  AND (sqlc.narg(created_gt)::timestamptz IS NULL OR coalesce(processed_at, created_at) > sqlc.narg(created_gt))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR coalesce(processed_at, created_at) >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lt)::timestamptz IS NULL OR coalesce(processed_at, created_at) < sqlc.narg(created_lt))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR coalesce(processed_at, created_at) <= sqlc.narg(created_lte))
ORDER BY seq DESC
LIMIT sqlc.arg(lim);

-- name: EventSeq :one
SELECT seq FROM events WHERE session_id = $1 AND id = $2;

-- name: SessionLoopState :one
SELECT agent, status, last_seq, archived_at FROM sessions WHERE id = $1;
