-- name: CreateMemoryStore :one
INSERT INTO memory_stores (tenant_id, id, name, description, metadata)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: GetMemoryStore :one
SELECT * FROM memory_stores WHERE tenant_id = $1 AND id = $2;

-- name: LockMemoryStore :one
-- The store, locked until the transaction ends: writes to its memories
-- take turns, so the store's bounds cannot race.
SELECT * FROM memory_stores WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: UpdateMemoryStore :one
UPDATE memory_stores SET name = $3, description = $4, metadata = $5, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ArchiveMemoryStore :one
UPDATE memory_stores SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: DeleteMemoryStore :one
DELETE FROM memory_stores WHERE tenant_id = $1 AND id = $2
RETURNING id;

-- name: ListMemoryStores :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM memory_stores
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR created_at >= sqlc.narg(created_gte)::timestamptz)
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR created_at <= sqlc.narg(created_lte)::timestamptz)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: MemoryStoreUsage :one
-- A store's memories and their bytes, which its bounds limit.
SELECT count(*)::bigint AS n, COALESCE(sum(size_bytes), 0)::bigint AS bytes
FROM memories WHERE tenant_id = $1 AND store_id = $2;

-- name: CreateMemory :one
INSERT INTO memories (tenant_id, store_id, id, path, content, content_sha256, size_bytes, memory_version_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING *;

-- name: GetMemory :one
SELECT * FROM memories WHERE tenant_id = $1 AND store_id = $2 AND id = $3;

-- name: LockMemory :one
SELECT * FROM memories WHERE tenant_id = $1 AND store_id = $2 AND id = $3 FOR UPDATE;

-- name: MemoryByPath :one
SELECT * FROM memories WHERE tenant_id = $1 AND store_id = $2 AND path = $3 FOR UPDATE;

-- name: UpdateMemory :one
UPDATE memories SET path = $4, content = $5, content_sha256 = $6, size_bytes = $7, memory_version_id = $8, updated_at = now()
WHERE tenant_id = $1 AND store_id = $2 AND id = $3
RETURNING *;

-- name: DeleteMemory :exec
DELETE FROM memories WHERE tenant_id = $1 AND store_id = $2 AND id = $3;

-- name: ListMemories :many
-- In path order (byte-wise), from the path from on (inclusive), below
-- prefix.
SELECT * FROM memories
WHERE tenant_id = sqlc.arg(tenant_id) AND store_id = sqlc.arg(store_id)
  AND starts_with(path, sqlc.arg(prefix)::text)
  AND path >= sqlc.arg(from_path)::text COLLATE "C"
ORDER BY path
LIMIT sqlc.arg(lim);

-- name: AllMemories :many
-- A store's memories in path order, at most lim (a sandbox's mount).
SELECT * FROM memories
WHERE tenant_id = $1 AND store_id = $2
ORDER BY path
LIMIT sqlc.arg(lim);

-- name: CreateMemoryVersion :one
INSERT INTO memory_versions (tenant_id, store_id, id, memory_id, operation, path, content, content_sha256, size_bytes, actor_type, actor_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
RETURNING *;

-- name: GetMemoryVersion :one
SELECT * FROM memory_versions WHERE tenant_id = $1 AND store_id = $2 AND id = $3;

-- name: RedactMemoryVersion :one
UPDATE memory_versions SET path = NULL, content = NULL, content_sha256 = NULL, size_bytes = NULL,
    redacted_at = COALESCE(redacted_at, now()), redactor_type = COALESCE(redactor_type, $4), redactor_id = COALESCE(redactor_id, $5)
WHERE tenant_id = $1 AND store_id = $2 AND id = $3
RETURNING *;

-- name: ListMemoryVersions :many
-- Newest first, keyset-paginated on (created_at, id), with the API's
-- filters.
SELECT * FROM memory_versions
WHERE tenant_id = sqlc.arg(tenant_id) AND store_id = sqlc.arg(store_id)
  AND (sqlc.arg(memory_id)::text = '' OR memory_id = sqlc.arg(memory_id)::text)
  AND (sqlc.arg(operation)::text = '' OR operation = sqlc.arg(operation)::text)
  AND (sqlc.arg(actor_type)::text = '' OR (actor_type = sqlc.arg(actor_type)::text AND actor_id = sqlc.arg(actor_id)::text))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR created_at >= sqlc.narg(created_gte)::timestamptz)
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR created_at <= sqlc.narg(created_lte)::timestamptz)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: MemoryRefs :many
-- A store's memories without their content: what a mount shows, in path
-- order, at most lim.
SELECT path, memory_version_id, content_sha256, size_bytes FROM memories
WHERE tenant_id = $1 AND store_id = $2
ORDER BY path
LIMIT sqlc.arg(lim);
