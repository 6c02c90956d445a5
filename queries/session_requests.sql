-- name: CreateSessionRequest :exec
INSERT INTO session_requests (tenant_id, session_id, idempotency_key, request_sha256)
VALUES ($1, $2, sqlc.narg(idempotency_key), $3);

-- name: SessionRequestByKey :one
SELECT session_id, request_sha256 FROM session_requests
WHERE tenant_id = $1 AND idempotency_key = $2;

-- name: RecentSessionRequest :one
SELECT session_id FROM session_requests
WHERE tenant_id = $1 AND request_sha256 = $2
  AND created_at > now() - make_interval(secs => sqlc.arg(within_seconds)::float8)
ORDER BY created_at DESC
LIMIT 1;
