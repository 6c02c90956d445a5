-- name: EnqueueSessionWork :execrows
-- Queues a work item for a self-hosted session that has no live one.
INSERT INTO environment_work (tenant_id, id, environment_id, session_id)
SELECT s.tenant_id, sqlc.arg(id)::text, s.environment_id, s.id
FROM sessions s
WHERE s.tenant_id = sqlc.arg(tenant_id) AND s.id = sqlc.arg(session_id) AND s.self_hosted
  AND s.archived_at IS NULL AND s.status <> 'terminated'
ON CONFLICT (tenant_id, session_id) WHERE state <> 'stopped' DO NOTHING;

-- name: EndStoppingWork :exec
-- A graceful stop whose worker went away ends when the lease runs out.
UPDATE environment_work SET state = 'stopped', stopped_at = now()
WHERE tenant_id = $1 AND environment_id = $2 AND state = 'stopping' AND lease_expires_at < now();

-- name: ClaimWork :one
-- Hands out the oldest item that is queued and not pending (or pending
-- longer than reclaim), or whose lease ran out; the lease is cleared.
UPDATE environment_work w
SET state = 'queued', polled_at = now(), worker_id = sqlc.narg(worker_id),
    acknowledged_at = NULL, last_heartbeat = NULL, lease_expires_at = NULL
WHERE w.tenant_id = sqlc.arg(tenant_id) AND w.id = (
    SELECT c.id FROM environment_work c
    WHERE c.tenant_id = sqlc.arg(tenant_id) AND c.environment_id = sqlc.arg(environment_id)
      AND ((c.state = 'queued' AND (c.polled_at IS NULL OR c.polled_at < now() - make_interval(secs => sqlc.arg(reclaim_seconds)::double precision)))
        OR (c.state IN ('starting', 'active') AND c.lease_expires_at < now()))
    ORDER BY c.created_at, c.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING w.*;

-- name: TouchWorker :execrows
UPDATE environment_workers SET last_poll_at = now()
WHERE tenant_id = $1 AND environment_id = $2 AND worker_id = $3;

-- name: AddWorker :exec
-- Records a worker new to the environment, while it has fewer than
-- max_workers (worker ids are the caller's to choose: the table stays
-- bounded).
INSERT INTO environment_workers (tenant_id, environment_id, worker_id)
SELECT sqlc.arg(tenant_id)::text, sqlc.arg(environment_id)::text, sqlc.arg(worker_id)::text
WHERE (SELECT count(*) FROM environment_workers
       WHERE tenant_id = sqlc.arg(tenant_id) AND environment_id = sqlc.arg(environment_id)) < sqlc.arg(max_workers)::bigint
ON CONFLICT (tenant_id, environment_id, worker_id) DO NOTHING;

-- name: ForgetIdleWorkers :exec
DELETE FROM environment_workers WHERE tenant_id = $1 AND environment_id = $2 AND last_poll_at < now() - interval '1 hour';

-- name: LockWork :one
SELECT * FROM environment_work WHERE tenant_id = $1 AND environment_id = $2 AND id = $3 FOR UPDATE;

-- name: GetWork :one
SELECT * FROM environment_work WHERE tenant_id = $1 AND environment_id = $2 AND id = $3;

-- name: AckWork :one
UPDATE environment_work
SET state = 'starting', acknowledged_at = now(), lease_expires_at = now() + make_interval(secs => sqlc.arg(ttl_seconds)::double precision)
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING *;

-- name: HeartbeatWork :one
UPDATE environment_work
SET state = CASE WHEN state = 'starting' THEN 'active' ELSE state END,
    started_at = COALESCE(started_at, now()), latest_heartbeat_at = now(),
    last_heartbeat = sqlc.arg(token)::text,
    lease_expires_at = now() + make_interval(secs => sqlc.arg(ttl_seconds)::double precision)
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING *;

-- name: RequeueWork :exec
UPDATE environment_work
SET state = 'queued', polled_at = NULL, acknowledged_at = NULL, last_heartbeat = NULL, lease_expires_at = NULL
WHERE tenant_id = $1 AND id = $2;

-- name: SetWorkState :one
UPDATE environment_work
SET state = sqlc.arg(state)::text,
    stop_requested_at = COALESCE(stop_requested_at, now()),
    stopped_at = CASE WHEN sqlc.arg(state)::text = 'stopped' THEN now() ELSE stopped_at END
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING *;

-- name: SetWorkMetadata :one
UPDATE environment_work SET metadata = $3 WHERE tenant_id = $1 AND id = $2 RETURNING *;

-- name: ListWork :many
-- Newest first, after the (created_at, id) of the page's last item.
SELECT * FROM environment_work
WHERE tenant_id = sqlc.arg(tenant_id) AND environment_id = sqlc.arg(environment_id)
  AND (sqlc.narg(after_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(after_created)::timestamptz, sqlc.arg(after_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: WorkStats :one
SELECT
    count(*) FILTER (WHERE state = 'queued' AND polled_at IS NULL)::bigint AS depth,
    count(*) FILTER (WHERE state = 'queued' AND polled_at IS NOT NULL)::bigint AS pending,
    min(created_at) FILTER (WHERE state = 'queued')::timestamptz AS oldest_queued_at,
    (SELECT count(*) FROM environment_workers ew
     WHERE ew.tenant_id = sqlc.arg(tenant_id) AND ew.environment_id = sqlc.arg(environment_id)
       AND ew.last_poll_at > now() - interval '30 seconds')::bigint AS workers_polling
FROM environment_work
WHERE tenant_id = sqlc.arg(tenant_id) AND environment_id = sqlc.arg(environment_id) AND state <> 'stopped';

-- name: SessionNeedsWorker :one
-- Whether the session still needs a worker after its item stopped: its
-- turn runs, input waits for the loop, or a built-in tool call of the turn
-- waits for its result.
SELECT EXISTS (
    SELECT 1 FROM sessions s
    WHERE s.tenant_id = $1 AND s.id = $2 AND s.self_hosted AND s.archived_at IS NULL
      AND (s.status = 'running'
        OR EXISTS (SELECT 1 FROM events q WHERE q.tenant_id = $1 AND q.session_id = $2 AND q.processed_at IS NULL)
        OR EXISTS (
            SELECT 1 FROM events u
            WHERE u.tenant_id = $1 AND u.session_id = $2 AND u.type = 'agent.tool_use'
              AND u.body->>'evaluated_permission' <> 'deny'
              AND NOT EXISTS (
                  SELECT 1 FROM events r
                  WHERE r.tenant_id = $1 AND r.session_id = $2
                    AND r.seq > u.seq AND r.type IN ('user.tool_result', 'agent.tool_result')
                    AND r.body->>'tool_use_id' = u.id)
              AND NOT EXISTS (
                  SELECT 1 FROM events i
                  WHERE i.tenant_id = $1 AND i.session_id = $2
                    AND i.seq > u.seq AND i.type = 'session.status_idle'
                    AND i.body->'stop_reason'->>'type' <> 'requires_action')))
) AS needed;

-- name: NotifyWork :exec
-- Tells every node's long polls (on commit) that environment work may be
-- waiting: the payload is "<tenant id>:<environment id>".
SELECT pg_notify('corral_work', sqlc.arg(payload)::text);
