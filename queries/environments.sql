-- name: CreateEnvironment :one
INSERT INTO environments (tenant_id, id, name, description, config, scope, metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: GetEnvironment :one
SELECT * FROM environments WHERE id = $1;

-- name: LockEnvironment :one
SELECT * FROM environments WHERE id = $1 FOR UPDATE;

-- name: UpdateEnvironment :one
UPDATE environments
SET name = $2, description = $3, config = $4, scope = $5, metadata = $6, updated_at = now()
WHERE id = $1
RETURNING *;

-- name: ArchiveEnvironment :one
UPDATE environments SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE id = $1
RETURNING *;

-- name: DeleteEnvironment :execrows
DELETE FROM environments WHERE id = $1;

-- name: ListEnvironments :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM environments
WHERE (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);
