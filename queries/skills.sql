-- name: CreateSkill :one
INSERT INTO skills (tenant_id, id, name, display_name, latest_version_id)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: GetSkill :one
SELECT * FROM skills WHERE tenant_id = $1 AND id = $2;

-- name: LockSkill :one
-- Serializes version writes of one skill (latest_version_id follows them).
SELECT * FROM skills WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: SetSkillLatest :exec
UPDATE skills SET latest_version_id = $3, updated_at = now()
WHERE tenant_id = $1 AND id = $2;

-- name: DeleteSkill :one
DELETE FROM skills WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ListSkills :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM skills
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(key_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(key_created)::timestamptz, sqlc.arg(key_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: CreateSkillVersion :one
INSERT INTO skill_versions (tenant_id, skill_id, id, name, description, size_bytes, file_count, blob_key, files)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING *;

-- name: GetSkillVersion :one
SELECT * FROM skill_versions WHERE tenant_id = $1 AND skill_id = $2 AND id = $3;

-- name: DeleteSkillVersion :one
DELETE FROM skill_versions WHERE tenant_id = $1 AND skill_id = $2 AND id = $3
RETURNING *;

-- name: CountSkillVersions :one
SELECT count(*)::bigint FROM skill_versions WHERE tenant_id = $1 AND skill_id = $2;

-- name: NewestSkillVersion :one
SELECT * FROM skill_versions WHERE tenant_id = $1 AND skill_id = $2
ORDER BY created_at DESC, id DESC LIMIT 1;

-- name: AllSkillVersions :many
-- Every version of a skill (its blobs go with it), bounded by lim.
SELECT * FROM skill_versions WHERE tenant_id = $1 AND skill_id = $2
ORDER BY created_at, id LIMIT sqlc.arg(lim);

-- name: ListSkillVersions :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM skill_versions
WHERE tenant_id = sqlc.arg(tenant_id) AND skill_id = sqlc.arg(skill_id)
  AND (sqlc.narg(key_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(key_created)::timestamptz, sqlc.arg(key_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: GetSkillVersionByID :one
-- A version by its id alone (ids are unique): what a sandbox's staged
-- skill file names.
SELECT * FROM skill_versions WHERE tenant_id = $1 AND id = $2;
