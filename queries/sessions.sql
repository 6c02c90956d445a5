-- name: CreateSession :one
INSERT INTO sessions (tenant_id, id, agent_id, agent_version, agent, environment_id, title, metadata, resources, vault_ids, sandbox_class, self_hosted, budget_cents, package_build)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
RETURNING *;

-- name: GetSession :one
SELECT * FROM sessions WHERE tenant_id = $1 AND id = $2;

-- name: LockSession :one
SELECT * FROM sessions WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: UpdateSession :one
UPDATE sessions SET title = $3, metadata = $4, agent = $5, budget_cents = $6, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: SetSessionResources :one
UPDATE sessions SET resources = $3, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ArchiveSession :one
UPDATE sessions SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: DeleteSession :execrows
DELETE FROM sessions WHERE tenant_id = $1 AND id = $2;

-- name: ListSessionsAfter :many
-- Ascending (created_at, id) strictly after the key, when given.
SELECT * FROM sessions
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(agent_id)::text IS NULL OR agent_id = sqlc.narg(agent_id))
  AND (sqlc.narg(agent_version)::bigint IS NULL OR agent_version = sqlc.narg(agent_version))
  AND (sqlc.narg(created_gt)::timestamptz IS NULL OR created_at > sqlc.narg(created_gt))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR created_at >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lt)::timestamptz IS NULL OR created_at < sqlc.narg(created_lt))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR created_at <= sqlc.narg(created_lte))
  AND (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(statuses)::text[] IS NULL OR status = ANY (sqlc.narg(statuses)::text[]))
  AND (sqlc.narg(key_created)::timestamptz IS NULL
       OR (created_at, id) > (sqlc.narg(key_created)::timestamptz, sqlc.arg(key_id)::text))
ORDER BY created_at ASC, id ASC
LIMIT sqlc.arg(lim);

-- name: ListSessionsBefore :many
-- Descending (created_at, id) strictly before the key, when given.
SELECT * FROM sessions
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(agent_id)::text IS NULL OR agent_id = sqlc.narg(agent_id))
  AND (sqlc.narg(agent_version)::bigint IS NULL OR agent_version = sqlc.narg(agent_version))
  AND (sqlc.narg(created_gt)::timestamptz IS NULL OR created_at > sqlc.narg(created_gt))
  AND (sqlc.narg(created_gte)::timestamptz IS NULL OR created_at >= sqlc.narg(created_gte))
  AND (sqlc.narg(created_lt)::timestamptz IS NULL OR created_at < sqlc.narg(created_lt))
  AND (sqlc.narg(created_lte)::timestamptz IS NULL OR created_at <= sqlc.narg(created_lte))
  AND (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(statuses)::text[] IS NULL OR status = ANY (sqlc.narg(statuses)::text[]))
  AND (sqlc.narg(key_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(key_created)::timestamptz, sqlc.arg(key_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: LockTenantSessions :exec
-- Serializes session creates within a tenant, so the count below cannot race.
SELECT pg_advisory_xact_lock(hashtextextended(sqlc.arg(tenant_id)::text, 7));

-- name: CountLiveSessions :one
SELECT count(*) FROM sessions WHERE tenant_id = $1 AND archived_at IS NULL AND status <> 'terminated';

-- name: GetSessionLimit :one
SELECT concurrent_sessions FROM tenant_quotas WHERE tenant_id = $1;

-- name: SessionEgressSeed :one
-- The session's placeholder seed, made by the first caller.
UPDATE sessions SET egress_seed = COALESCE(egress_seed, sqlc.arg(seed)::bytea)
WHERE tenant_id = sqlc.arg(tenant_id) AND id = sqlc.arg(id)
RETURNING egress_seed;
