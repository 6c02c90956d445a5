-- Principals: the users and service principals of a tenant, as records of
-- their own that admins list, grant roles to and disable.
--
-- A service principal holds API keys; its keys act as it and carry its
-- roles, so granting or disabling the principal changes all of its keys at
-- once. A user is an identity from an OpenID Provider (issuer and subject);
-- its record is made on its first token, or ahead of it by an admin who
-- wants to grant roles or disable it before it signs in. A user's roles are
-- those its token's groups map to (the issuer's configuration) plus those
-- granted to its record.
--
-- Every key issued before this migration gets a service principal of its
-- own, with the key's roles, so nothing changes for existing keys.

-- +goose Up
CREATE TABLE principals (
    tenant_id    text        NOT NULL REFERENCES tenants (id),
    id           text        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('user', 'service')),
    name         text        NOT NULL,
    -- A user's OpenID Provider and its subject there; NULL for services.
    issuer       text,
    subject      text,
    roles        text[]      NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    disabled_at  timestamptz,
    last_seen_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, issuer, subject),
    CHECK ((kind = 'user') = (issuer IS NOT NULL AND subject IS NOT NULL))
);

-- Before row-level security is on: every existing key gets a service
-- principal of its own, with its id derived from the key's.
INSERT INTO principals (tenant_id, id, kind, name, roles, created_at)
SELECT tenant_id, 'prn_' || substr(id, 5), 'service',
       CASE WHEN principal LIKE 'key:%' THEN substr(principal, 5) ELSE principal END,
       roles, created_at
FROM api_keys;

ALTER TABLE api_keys ADD COLUMN principal_id text;
UPDATE api_keys SET principal_id = 'prn_' || substr(id, 5);
ALTER TABLE api_keys
    ALTER COLUMN principal_id SET NOT NULL,
    ADD FOREIGN KEY (tenant_id, principal_id) REFERENCES principals (tenant_id, id),
    DROP COLUMN principal,
    DROP COLUMN roles;
CREATE INDEX api_keys_by_principal ON api_keys (tenant_id, principal_id);

-- Row-level security comes after the backfill above, which reads and writes
-- across tenants as the owner.
ALTER TABLE principals ENABLE ROW LEVEL SECURITY;
ALTER TABLE principals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON principals
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
-- authenticate_api_key reads a key's principal before any tenant is known.
CREATE POLICY owner_access ON principals FOR SELECT TO CURRENT_USER USING (true);
GRANT SELECT, INSERT, UPDATE (name, roles, disabled_at, last_seen_at) ON principals TO corral_app;

-- The key with this SHA-256, tenant or operator, with what authentication
-- needs to decide. A tenant key's roles are its principal's. Returns no row
-- for an unknown key.
DROP FUNCTION authenticate_api_key(bytea);
-- +goose StatementBegin
CREATE FUNCTION authenticate_api_key(key_hash bytea)
RETURNS TABLE (tenant_id text, key_id text, principal_id text, principal text, roles text[],
               tenant_status text, revoked boolean, disabled boolean, last_used_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT k.tenant_id, k.id, p.id, p.kind || ':' || p.name, p.roles, t.status,
           k.revoked_at IS NOT NULL, p.disabled_at IS NOT NULL, k.last_used_at
    FROM api_keys k
    JOIN tenants t ON t.id = k.tenant_id
    JOIN principals p ON p.tenant_id = k.tenant_id AND p.id = k.principal_id
    WHERE k.secret_hash = key_hash
    UNION ALL
    SELECT NULL, o.id, NULL, o.principal, o.roles, NULL, o.revoked_at IS NOT NULL, false, o.last_used_at
    FROM operator_keys o
    WHERE o.secret_hash = key_hash
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION authenticate_api_key(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION authenticate_api_key(bytea) TO corral_app;

-- +goose Down
DROP FUNCTION authenticate_api_key(bytea);
ALTER TABLE api_keys
    ADD COLUMN principal text NOT NULL DEFAULT 'key',
    ADD COLUMN roles     text[] NOT NULL DEFAULT '{admin}';
UPDATE api_keys k SET principal = 'key:' || p.name, roles = p.roles
FROM principals p WHERE p.tenant_id = k.tenant_id AND p.id = k.principal_id;
DROP INDEX api_keys_by_principal;
ALTER TABLE api_keys DROP COLUMN principal_id;
DROP TABLE principals;
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
