-- name: CreateAPIKey :exec
INSERT INTO api_keys (tenant_id, id, name, secret_hash, principal_id, prefix, environment_id)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: ListAPIKeys :many
SELECT k.tenant_id, k.id, k.name, k.principal_id, p.kind, p.name AS principal_name, p.roles,
       k.prefix, k.created_at, k.revoked_at, k.last_used_at, k.environment_id
FROM api_keys k
JOIN principals p ON p.tenant_id = k.tenant_id AND p.id = k.principal_id
WHERE k.tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(principal_id)::text IS NULL OR k.principal_id = sqlc.narg(principal_id)::text)
ORDER BY k.created_at, k.id;

-- name: GetAPIKey :one
SELECT k.tenant_id, k.id, k.name, k.principal_id, p.kind, p.name AS principal_name, p.roles,
       k.prefix, k.created_at, k.revoked_at, k.last_used_at, k.environment_id
FROM api_keys k
JOIN principals p ON p.tenant_id = k.tenant_id AND p.id = k.principal_id
WHERE k.tenant_id = $1 AND k.id = $2;

-- name: GetAPIKeyIDByHash :one
SELECT id FROM api_keys WHERE tenant_id = $1 AND secret_hash = $2;

-- name: RevokeAPIKey :execrows
UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
WHERE tenant_id = $1 AND id = $2;
