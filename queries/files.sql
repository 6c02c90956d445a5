-- name: LockTenantFiles :exec
-- Serializes file inserts within a tenant, so the storage sum below cannot
-- race.
SELECT pg_advisory_xact_lock(hashtextextended(sqlc.arg(tenant_id)::text, 17));

-- name: FileBytes :one
-- The tenant's stored bytes, which its storage quota bounds.
SELECT COALESCE(sum(size_bytes), 0)::bigint FROM files WHERE tenant_id = $1;

-- name: CreateFile :one
INSERT INTO files (tenant_id, id, filename, mime_type, size_bytes, downloadable, scope_id, blob_key, sha256)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING *;

-- name: GetFile :one
SELECT * FROM files WHERE tenant_id = $1 AND id = $2;

-- name: DeleteFile :one
DELETE FROM files WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ListFiles :many
-- Newest first, keyset-paginated on (created_at, id): the rows after the
-- key (older), or with before set the rows before it (newer), oldest of
-- them first so that the page nearest the key comes back.
SELECT * FROM files
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(scope_id)::text IS NULL OR scope_id = sqlc.narg(scope_id)::text)
  AND (cardinality(sqlc.arg(ids)::text[]) = 0 OR id = ANY (sqlc.arg(ids)::text[]))
  AND (sqlc.narg(key_created)::timestamptz IS NULL
       OR (NOT sqlc.arg(before)::bool AND (created_at, id) < (sqlc.narg(key_created)::timestamptz, sqlc.arg(key_id)::text))
       OR (sqlc.arg(before)::bool AND (created_at, id) > (sqlc.narg(key_created)::timestamptz, sqlc.arg(key_id)::text)))
ORDER BY
  CASE WHEN sqlc.arg(before)::bool THEN created_at END ASC,
  CASE WHEN sqlc.arg(before)::bool THEN id END ASC,
  created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: ScopeFiles :many
-- A session's outputs, all of them up to lim, oldest first.
SELECT * FROM files
WHERE tenant_id = $1 AND scope_id = $2
ORDER BY created_at, id
LIMIT sqlc.arg(lim);

-- name: FileBlobKeysIn :many
-- Which of keys the tenant's files hold (the orphan sweep's check).
SELECT blob_key FROM files
WHERE tenant_id = sqlc.arg(tenant_id) AND blob_key = ANY (sqlc.arg(keys)::text[]);
