-- Vaults and their credentials (the Managed Agents shapes), and each
-- tenant's data key.
--
-- A credential's secret (a static_bearer token) is stored only as
-- AES-256-GCM ciphertext under its tenant's data key, with the tenant and
-- the credential's id as additional data, so a ciphertext copied to another
-- row does not open. The data key is stored only sealed by the cluster's
-- keyring (internal/seal), under the key id that sealed it, so a keyring
-- rotation still opens it (and the store reseals it under the new key on
-- first use). Nothing here is readable without the seal key file.

-- +goose Up
CREATE TABLE tenant_data_keys (
    tenant_id  text        PRIMARY KEY REFERENCES tenants (id),
    -- The seal keyring's envelope of the 32-byte data key.
    seal_key_id text       NOT NULL,
    nonce      bytea       NOT NULL,
    sealed     bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE vaults (
    tenant_id    text        NOT NULL REFERENCES tenants (id),
    id           text        NOT NULL,
    display_name text        NOT NULL,
    metadata     jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    archived_at  timestamptz,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE vault_credentials (
    tenant_id      text        NOT NULL,
    vault_id       text        NOT NULL,
    id             text        NOT NULL,
    display_name   text,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    -- auth.type: static_bearer or mcp_oauth (environment_variable is
    -- refused by the API until egress can substitute it).
    auth_type      text        NOT NULL CHECK (auth_type IN ('static_bearer', 'mcp_oauth')),
    -- The URL as the tenant sent it, and its normalized form, which the
    -- MCP client matches an agent's mcp_servers URL against.
    mcp_server_url text        NOT NULL,
    match_url      text        NOT NULL,
    -- The secrets (token; an mcp_oauth refresh token and client secret),
    -- as JSON encrypted under the tenant's data key: ciphertext and GCM tag.
    secret_nonce   bytea       NOT NULL,
    secret         bytea       NOT NULL,
    -- mcp_oauth: when the access token expires, and how to refresh it
    -- (client_id, token_endpoint, token_endpoint_auth type, resource,
    -- scope; nothing secret). NULL without a refresh.
    expires_at     timestamptz,
    oauth          jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    archived_at    timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, vault_id) REFERENCES vaults (tenant_id, id) ON DELETE CASCADE
);

-- One active credential per MCP server per vault.
CREATE UNIQUE INDEX vault_credentials_one_per_server ON vault_credentials (tenant_id, vault_id, match_url) WHERE archived_at IS NULL;

ALTER TABLE tenant_data_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_data_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_data_keys
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE vaults ENABLE ROW LEVEL SECURITY;
ALTER TABLE vaults FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON vaults
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE vault_credentials ENABLE ROW LEVEL SECURITY;
ALTER TABLE vault_credentials FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON vault_credentials
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT SELECT, INSERT, UPDATE ON tenant_data_keys TO corral_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON vaults TO corral_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON vault_credentials TO corral_app;

-- +goose Down
DROP TABLE vault_credentials;
DROP TABLE vaults;
DROP TABLE tenant_data_keys;
