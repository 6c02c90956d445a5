-- Identity: tenant status, API keys with principals and roles, operator keys
-- (no tenant), and the SECURITY DEFINER functions that authentication and
-- tenant administration need before (or beyond) one tenant is known.
--
-- Functions run as the owner. Row-level security is forced on tenant tables,
-- so it binds the owner too; the policies owner_access below let the owner,
-- and only the owner, read across tenants where a function needs to. The
-- application role stays bound by tenant_isolation alone.

-- +goose Up
ALTER TABLE tenants ADD COLUMN status text NOT NULL DEFAULT 'active'
    CHECK (status IN ('active', 'suspended'));

ALTER TABLE api_keys
    -- Who the key acts as (shown in the audit log), and its roles within the tenant.
    ADD COLUMN principal    text        NOT NULL DEFAULT 'key',
    ADD COLUMN roles        text[]      NOT NULL DEFAULT '{admin}',
    -- The key's first characters, so a leaked key can be matched to its row.
    ADD COLUMN prefix       text        NOT NULL DEFAULT '',
    ADD COLUMN last_used_at timestamptz;

-- Keys of fleet principals (operators). Not tenant data: no tenant_id, and
-- the application role has no grant on it; it is read only through
-- authenticate_api_key and written by the owner (corral admin bootstrap-key).
CREATE TABLE operator_keys (
    id           text        PRIMARY KEY,
    name         text        NOT NULL,
    principal    text        NOT NULL,
    roles        text[]      NOT NULL,
    secret_hash  bytea       NOT NULL UNIQUE,
    prefix       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz
);

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('CREATE POLICY owner_access ON tenants TO %I USING (true)', current_user);
    EXECUTE format('CREATE POLICY owner_access ON api_keys TO %I USING (true)', current_user);
END $$;
-- +goose StatementEnd

-- Creating and suspending a tenant run in that tenant's scope, so
-- tenant_isolation (USING doubles as WITH CHECK) still applies.
GRANT INSERT, UPDATE (status, name) ON tenants TO corral_app;
GRANT UPDATE (revoked_at) ON api_keys TO corral_app;

-- The key with this SHA-256, tenant or operator, with what authentication
-- needs to decide. Returns no row for an unknown key.
-- +goose StatementBegin
CREATE FUNCTION authenticate_api_key(key_hash bytea)
RETURNS TABLE (tenant_id text, key_id text, principal text, roles text[], tenant_status text, revoked boolean, last_used_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT k.tenant_id, k.id, k.principal, k.roles, t.status, k.revoked_at IS NOT NULL, k.last_used_at
    FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
    WHERE k.secret_hash = key_hash
    UNION ALL
    SELECT NULL, o.id, o.principal, o.roles, NULL, o.revoked_at IS NOT NULL, o.last_used_at
    FROM operator_keys o
    WHERE o.secret_hash = key_hash
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION authenticate_api_key(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION authenticate_api_key(bytea) TO corral_app;

-- Records that a key was used, at most once a minute per key.
-- +goose StatementBegin
CREATE FUNCTION touch_api_key(key_tenant text, key_id text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public AS $$
    UPDATE api_keys SET last_used_at = now()
    WHERE tenant_id = key_tenant AND id = key_id
      AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
    UPDATE operator_keys SET last_used_at = now()
    WHERE key_tenant IS NULL AND id = key_id
      AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION touch_api_key(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION touch_api_key(text, text) TO corral_app;

-- Every tenant, for operators' listings.
-- +goose StatementBegin
CREATE FUNCTION list_tenants()
RETURNS TABLE (id text, name text, status text, created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT id, name, status, created_at FROM tenants ORDER BY created_at, id
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION list_tenants() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION list_tenants() TO corral_app;

-- +goose Down
DROP FUNCTION list_tenants();
DROP FUNCTION touch_api_key(text, text);
DROP FUNCTION authenticate_api_key(bytea);
REVOKE INSERT, UPDATE (status, name) ON tenants FROM corral_app;
REVOKE UPDATE (revoked_at) ON api_keys FROM corral_app;
DROP POLICY owner_access ON api_keys;
DROP POLICY owner_access ON tenants;
DROP TABLE operator_keys;
ALTER TABLE api_keys DROP COLUMN last_used_at, DROP COLUMN prefix, DROP COLUMN roles, DROP COLUMN principal;
ALTER TABLE tenants DROP COLUMN status;
