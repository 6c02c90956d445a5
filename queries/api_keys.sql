-- name: CreateAPIKey :one
INSERT INTO api_keys (tenant_id, id, name, secret_hash)
VALUES ($1, $2, $3, $4)
RETURNING tenant_id, id, name, created_at, revoked_at;

-- name: ListAPIKeys :many
SELECT tenant_id, id, name, created_at, revoked_at
FROM api_keys
ORDER BY created_at, id;

-- name: GetAPIKeyByHash :one
SELECT tenant_id, id, name, created_at, revoked_at
FROM api_keys
WHERE secret_hash = $1;
