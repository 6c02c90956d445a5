-- name: CreateAPIKey :one
INSERT INTO api_keys (tenant_id, id, name, secret_hash, principal, roles, prefix)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING tenant_id, id, name, principal, roles, prefix, created_at, revoked_at, last_used_at;

-- name: ListAPIKeys :many
SELECT tenant_id, id, name, principal, roles, prefix, created_at, revoked_at, last_used_at
FROM api_keys
ORDER BY created_at, id;

-- name: GetAPIKeyByHash :one
SELECT tenant_id, id, name, principal, roles, prefix, created_at, revoked_at, last_used_at
FROM api_keys
WHERE secret_hash = $1;

-- name: RevokeAPIKey :one
UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
WHERE id = $1
RETURNING tenant_id, id, name, principal, roles, prefix, created_at, revoked_at, last_used_at;
