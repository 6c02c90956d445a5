-- The Managed Agents resources: agents (with immutable versions),
-- environments and sessions. Every table is tenant-owned and follows the
-- pattern of 00001: tenant_id, row-level security enabled and forced, one
-- tenant_isolation policy, grants to corral_app.
--
-- The API layer owns the shape of the JSON columns (agent_versions.spec,
-- environments.config, sessions.agent): they hold the resolved form that the
-- API returns, so reading a row never re-applies defaults.

-- +goose Up
CREATE TABLE agents (
    tenant_id      text        NOT NULL REFERENCES tenants (id),
    id             text        NOT NULL,
    latest_version bigint      NOT NULL CHECK (latest_version >= 1),
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- When the latest version was made, or the agent archived.
    updated_at     timestamptz NOT NULL DEFAULT now(),
    archived_at    timestamptz,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX agents_by_created ON agents (tenant_id, created_at, id);

-- One row per version. The application role may insert and read versions but
-- never change or remove one: versions are immutable.
CREATE TABLE agent_versions (
    tenant_id  text        NOT NULL,
    agent_id   text        NOT NULL,
    version    bigint      NOT NULL CHECK (version >= 1),
    name       text        NOT NULL,
    -- Everything else the API returns for this version (model, tools, ...).
    spec       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, agent_id, version),
    FOREIGN KEY (tenant_id, agent_id) REFERENCES agents (tenant_id, id) ON DELETE CASCADE
);

CREATE TABLE environments (
    tenant_id   text        NOT NULL REFERENCES tenants (id),
    id          text        NOT NULL,
    name        text        NOT NULL,
    description text,
    config      jsonb       NOT NULL,
    scope       text        NOT NULL DEFAULT 'organization',
    metadata    jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    archived_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    CONSTRAINT environments_name_unique UNIQUE (tenant_id, name)
);
CREATE INDEX environments_by_created ON environments (tenant_id, created_at, id);

CREATE TABLE sessions (
    tenant_id      text        NOT NULL REFERENCES tenants (id),
    id             text        NOT NULL,
    status         text        NOT NULL DEFAULT 'idle'
                   CHECK (status IN ('idle', 'running', 'rescheduling', 'terminated')),
    -- The agent version the session was created from, and the resolved
    -- snapshot (with any overrides and session-local tool changes applied).
    agent_id       text        NOT NULL,
    agent_version  bigint      NOT NULL,
    agent          jsonb       NOT NULL,
    environment_id text        NOT NULL,
    title          text,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    resources      jsonb       NOT NULL DEFAULT '[]',
    vault_ids      jsonb       NOT NULL DEFAULT '[]',
    -- stats and usage, accumulated by the agent loop.
    active_seconds                 double precision NOT NULL DEFAULT 0,
    input_tokens                   bigint NOT NULL DEFAULT 0,
    output_tokens                  bigint NOT NULL DEFAULT 0,
    cache_read_input_tokens        bigint NOT NULL DEFAULT 0,
    cache_creation_5m_input_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_1h_input_tokens bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    archived_at    timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, agent_id, agent_version) REFERENCES agent_versions (tenant_id, agent_id, version),
    -- An environment in use by sessions cannot be deleted.
    CONSTRAINT sessions_environment_fkey FOREIGN KEY (tenant_id, environment_id) REFERENCES environments (tenant_id, id)
);
CREATE INDEX sessions_by_created ON sessions (tenant_id, created_at, id);
CREATE INDEX sessions_by_agent ON sessions (tenant_id, agent_id, agent_version);
CREATE INDEX sessions_by_environment ON sessions (tenant_id, environment_id);

ALTER TABLE agents ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agents
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE agent_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_versions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agent_versions
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE environments ENABLE ROW LEVEL SECURITY;
ALTER TABLE environments FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON environments
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON sessions
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

-- Agents have no delete (archive is terminal); versions are append-only.
GRANT SELECT, INSERT, UPDATE ON agents TO corral_app;
GRANT SELECT, INSERT ON agent_versions TO corral_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON environments TO corral_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON sessions TO corral_app;

-- +goose Down
DROP TABLE sessions;
DROP TABLE environments;
DROP TABLE agent_versions;
DROP TABLE agents;
