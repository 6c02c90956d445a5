-- name: CreatePrincipal :one
INSERT INTO principals (tenant_id, id, kind, name, issuer, subject, roles)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: ListPrincipals :many
SELECT * FROM principals
WHERE tenant_id = $1
ORDER BY created_at, id;

-- name: GetPrincipal :one
SELECT * FROM principals WHERE tenant_id = $1 AND id = $2;

-- name: SetPrincipalRoles :one
UPDATE principals SET roles = $3 WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: SetPrincipalDisabled :one
UPDATE principals
SET disabled_at = CASE WHEN sqlc.arg(disabled)::boolean THEN COALESCE(disabled_at, now()) END
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: UpsertUser :one
-- The user with this issuer and subject, made on first sight. Its last-seen
-- time moves at most once a minute, so that a busy user costs no write per
-- request.
INSERT INTO principals (tenant_id, id, kind, name, issuer, subject, last_seen_at)
VALUES ($1, $2, 'user', $3, $4, $5, now())
ON CONFLICT (tenant_id, issuer, subject) DO UPDATE
SET last_seen_at = now()
WHERE principals.last_seen_at IS NULL OR principals.last_seen_at < now() - interval '1 minute'
RETURNING *;

-- name: GetUser :one
SELECT * FROM principals WHERE tenant_id = $1 AND issuer = $2 AND subject = $3;
