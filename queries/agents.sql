-- name: CreateAgent :one
INSERT INTO agents (tenant_id, id, latest_version)
VALUES ($1, $2, 1)
RETURNING *;

-- name: InsertAgentVersion :one
INSERT INTO agent_versions (tenant_id, agent_id, version, name, spec)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: LockAgent :one
SELECT * FROM agents WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: SetAgentLatestVersion :one
UPDATE agents SET latest_version = $3, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ArchiveAgent :one
UPDATE agents SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: GetAgentVersion :one
-- A version of an agent; the latest when version is null.
SELECT sqlc.embed(a), sqlc.embed(v)
FROM agents a
JOIN agent_versions v ON v.tenant_id = a.tenant_id AND v.agent_id = a.id
WHERE a.tenant_id = sqlc.arg(tenant_id) AND a.id = sqlc.arg(id) AND v.version = COALESCE(sqlc.narg(version)::bigint, a.latest_version);

-- name: ListAgents :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT sqlc.embed(a), sqlc.embed(v)
FROM agents a
JOIN agent_versions v ON v.tenant_id = a.tenant_id AND v.agent_id = a.id AND v.version = a.latest_version
WHERE a.tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR a.created_at >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR a.created_at <= sqlc.narg(created_lte))
  AND (sqlc.arg(include_archived)::bool OR a.archived_at IS NULL)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (a.created_at, a.id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY a.created_at DESC, a.id DESC
LIMIT sqlc.arg(lim);

-- name: ListAgentVersions :many
-- Newest version first.
SELECT sqlc.embed(a), sqlc.embed(v)
FROM agents a
JOIN agent_versions v ON v.tenant_id = a.tenant_id AND v.agent_id = a.id
WHERE a.tenant_id = sqlc.arg(tenant_id) AND a.id = sqlc.arg(id)
  AND (sqlc.narg(before_version)::bigint IS NULL OR v.version < sqlc.narg(before_version))
ORDER BY v.version DESC
LIMIT sqlc.arg(lim);
