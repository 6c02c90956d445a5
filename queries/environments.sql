-- name: CreateEnvironment :one
INSERT INTO environments (tenant_id, id, name, description, config, scope, metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: GetEnvironment :one
SELECT * FROM environments WHERE tenant_id = $1 AND id = $2;

-- name: LockEnvironment :one
SELECT * FROM environments WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: UpdateEnvironment :one
UPDATE environments
SET name = $3, description = $4, config = $5, scope = $6, metadata = $7, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ArchiveEnvironment :one
UPDATE environments SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: DeleteEnvironment :execrows
DELETE FROM environments WHERE tenant_id = $1 AND id = $2;

-- name: ListEnvironments :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM environments
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);
