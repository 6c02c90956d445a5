-- name: GetTenant :one
SELECT id, name, status, created_at FROM tenants WHERE id = $1;

-- name: CreateTenant :one
INSERT INTO tenants (id, name) VALUES ($1, $2)
RETURNING id, name, status, created_at;

-- name: SetTenantStatus :one
UPDATE tenants SET status = $2 WHERE id = $1
RETURNING id, name, status, created_at;

-- name: GetTenantQuota :one
SELECT * FROM tenant_quotas WHERE tenant_id = $1;

-- name: UpsertTenantQuota :one
INSERT INTO tenant_quotas (tenant_id, concurrent_sessions, concurrent_sandboxes, cpu_millis, memory_mib, requests_per_second, request_burst, file_storage_mib, model_tokens_per_day)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant_id) DO UPDATE SET
    concurrent_sessions = EXCLUDED.concurrent_sessions,
    concurrent_sandboxes = EXCLUDED.concurrent_sandboxes,
    cpu_millis = EXCLUDED.cpu_millis,
    memory_mib = EXCLUDED.memory_mib,
    requests_per_second = EXCLUDED.requests_per_second,
    request_burst = EXCLUDED.request_burst,
    file_storage_mib = EXCLUDED.file_storage_mib,
    model_tokens_per_day = EXCLUDED.model_tokens_per_day,
    updated_at = now()
RETURNING *;

-- name: TenantTokensToday :one
-- The tenant's model tokens of the current UTC day (0 before its first).
SELECT COALESCE((SELECT tokens FROM tenant_token_usage
                 WHERE tenant_id = $1 AND day = (now() AT TIME ZONE 'UTC')::date), 0)::bigint AS tokens;

-- name: AppendAudit :exec
INSERT INTO audit_log (tenant_id, principal, action, resource, outcome, remote_addr, request_id)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: ListAudit :many
SELECT * FROM audit_log
WHERE tenant_id = sqlc.arg(tenant_id)::text
  AND (sqlc.arg(before_id)::bigint <= 0 OR id < sqlc.arg(before_id)::bigint)
ORDER BY id DESC
LIMIT sqlc.arg(lim);
