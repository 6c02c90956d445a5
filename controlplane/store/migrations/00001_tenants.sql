-- The first migration: tenants, and the first tenant-owned table.
--
-- Every tenant-owned table carries tenant_id, has row-level security enabled
-- and forced, and one policy keyed on the per-transaction setting
-- corral.tenant_id (set by the store at the start of every transaction). With
-- the setting absent, current_setting(..., true) is NULL and no row matches:
-- closed by default.
--
-- The application connects as corral_app, which owns nothing; migrations run
-- as the owner. The role must exist before this migration runs (corral dev
-- creates it; operators create it, see the README).

-- +goose Up
CREATE TABLE tenants (
    id         text        PRIMARY KEY,
    name       text        NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO tenants (id, name) VALUES ('tenant_default', 'default');

CREATE TABLE api_keys (
    tenant_id   text        NOT NULL REFERENCES tenants (id),
    id          text        NOT NULL,
    name        text        NOT NULL,
    -- SHA-256 of the whole key; the key itself is never stored.
    secret_hash bytea       NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    PRIMARY KEY (tenant_id, id)
);

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants
    USING (id = current_setting('corral.tenant_id', true));

ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON api_keys
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT USAGE ON SCHEMA public TO corral_app;
-- The application reads the schema version to refuse a schema it does not know.
GRANT SELECT ON goose_db_version TO corral_app;
GRANT SELECT ON tenants TO corral_app;
GRANT SELECT, INSERT, UPDATE ON api_keys TO corral_app;

-- +goose Down
DROP TABLE api_keys;
DROP TABLE tenants;
