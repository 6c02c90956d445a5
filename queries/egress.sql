-- name: AppendEgress :exec
-- A record the host sent before (same host and record id) is not stored
-- again.
INSERT INTO egress_connections (tenant_id, session_id, host_id, dest_host, dest_port, address, allowed, reason, bytes_up, bytes_down, started_at, ended_at, credential_injected, record_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (host_id, record_id) WHERE record_id <> '' DO NOTHING;

-- name: ListEgress :many
SELECT * FROM egress_connections
WHERE tenant_id = sqlc.arg(tenant_id)::text
  AND (sqlc.arg(session_id)::text = '' OR session_id = sqlc.arg(session_id)::text)
  AND (sqlc.arg(before_id)::bigint <= 0 OR id < sqlc.arg(before_id)::bigint)
ORDER BY id DESC
LIMIT sqlc.arg(lim);
