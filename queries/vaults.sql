-- name: GetTenantDataKey :one
SELECT * FROM tenant_data_keys WHERE tenant_id = $1;

-- name: CreateTenantDataKey :exec
-- Two first uses at once: the first insert wins and the other reads it.
INSERT INTO tenant_data_keys (tenant_id, seal_key_id, nonce, sealed)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id) DO NOTHING;

-- name: ResealTenantDataKey :exec
-- A keyring rotation: the same data key, sealed under the new key.
UPDATE tenant_data_keys SET seal_key_id = $3, nonce = $4, sealed = $5, updated_at = now()
WHERE tenant_id = $1 AND seal_key_id = $2;

-- name: CreateVault :one
INSERT INTO vaults (tenant_id, id, display_name, metadata)
VALUES ($1, $2, $3, $4)
RETURNING *;

-- name: GetVault :one
SELECT * FROM vaults WHERE tenant_id = $1 AND id = $2;

-- name: LockVault :one
SELECT * FROM vaults WHERE tenant_id = $1 AND id = $2 FOR UPDATE;

-- name: UpdateVault :one
UPDATE vaults SET display_name = $3, metadata = $4, updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ArchiveVault :one
UPDATE vaults SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: ArchiveVaultCredentials :exec
-- Archiving a vault archives its credentials.
UPDATE vault_credentials SET archived_at = now(), updated_at = now()
WHERE tenant_id = $1 AND vault_id = $2 AND archived_at IS NULL;

-- name: DeleteVault :execrows
DELETE FROM vaults WHERE tenant_id = $1 AND id = $2;

-- name: ListVaults :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM vaults
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: ActiveVaultIDs :many
-- Which of ids name a vault of the tenant that is not archived; locked
-- against an archive until the caller's transaction ends.
SELECT id FROM vaults
WHERE tenant_id = sqlc.arg(tenant_id) AND id = ANY (sqlc.arg(ids)::text[]) AND archived_at IS NULL
FOR SHARE;

-- name: CreateVaultCredential :one
INSERT INTO vault_credentials (tenant_id, vault_id, id, display_name, metadata, auth_type, mcp_server_url, match_url, secret_nonce, secret, expires_at, oauth, model_base_url, secret_name, allowed_hosts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
RETURNING *;

-- name: GetVaultCredential :one
SELECT * FROM vault_credentials WHERE tenant_id = $1 AND vault_id = $2 AND id = $3;

-- name: LockVaultCredential :one
SELECT * FROM vault_credentials WHERE tenant_id = $1 AND vault_id = $2 AND id = $3 FOR UPDATE;

-- name: UpdateVaultCredential :one
UPDATE vault_credentials SET display_name = $4, metadata = $5, secret_nonce = $6, secret = $7, expires_at = $8, oauth = $9, allowed_hosts = $10, updated_at = now()
WHERE tenant_id = $1 AND vault_id = $2 AND id = $3
RETURNING *;

-- name: StoreRefreshedToken :execrows
-- A refreshed mcp_oauth token, stored only if nobody changed the
-- credential since it was read (another refresh, an update, an archive).
UPDATE vault_credentials SET secret_nonce = $4, secret = $5, expires_at = $6, updated_at = now()
WHERE tenant_id = $1 AND vault_id = $2 AND id = $3 AND updated_at = $7 AND archived_at IS NULL;

-- name: ArchiveVaultCredential :one
UPDATE vault_credentials SET archived_at = COALESCE(archived_at, now()), updated_at = CASE WHEN archived_at IS NULL THEN now() ELSE updated_at END
WHERE tenant_id = $1 AND vault_id = $2 AND id = $3
RETURNING *;

-- name: DeleteVaultCredential :execrows
DELETE FROM vault_credentials WHERE tenant_id = $1 AND vault_id = $2 AND id = $3;

-- name: CountActiveVaultCredentials :one
SELECT count(*) FROM vault_credentials WHERE tenant_id = $1 AND vault_id = $2 AND archived_at IS NULL;

-- name: ListVaultCredentials :many
-- Newest first, keyset-paginated on (created_at, id).
SELECT * FROM vault_credentials
WHERE tenant_id = sqlc.arg(tenant_id) AND vault_id = sqlc.arg(vault_id)
  AND (sqlc.arg(include_archived)::bool OR archived_at IS NULL)
  AND (sqlc.narg(before_created)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(before_created)::timestamptz, sqlc.arg(before_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT sqlc.arg(lim);

-- name: SessionMCPCredentials :many
-- The active credentials for an MCP server (by normalized URL), or the
-- model credentials (by their fixed match_url), in the active vaults
-- among ids.
SELECT c.* FROM vault_credentials c
JOIN vaults v ON v.tenant_id = c.tenant_id AND v.id = c.vault_id
WHERE c.tenant_id = sqlc.arg(tenant_id) AND c.vault_id = ANY (sqlc.arg(vault_ids)::text[])
  AND c.match_url = sqlc.arg(match_url)
  AND c.archived_at IS NULL AND v.archived_at IS NULL;

-- name: SessionEnvironmentCredentials :many
-- The active environment_variable credentials in the active vaults among
-- ids.
SELECT c.* FROM vault_credentials c
JOIN vaults v ON v.tenant_id = c.tenant_id AND v.id = c.vault_id
WHERE c.tenant_id = sqlc.arg(tenant_id) AND c.vault_id = ANY (sqlc.arg(vault_ids)::text[])
  AND c.auth_type = 'environment_variable'
  AND c.archived_at IS NULL AND v.archived_at IS NULL;
