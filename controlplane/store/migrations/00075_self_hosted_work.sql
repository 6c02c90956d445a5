-- Self-hosted environments: the work queue their workers poll, and the
-- environment keys those workers authenticate with.
--
-- A session in a self_hosted environment (sessions.self_hosted, fixed at
-- creation) has its built-in tools run by a worker on the tenant's own
-- machine. The worker learns of the session from a work item: one is queued
-- when the session is created and when new input reaches a session that has
-- no live item. At most one item per session is live (not stopped).
--
--   queued ──poll──▶ queued, polled_at set (pending) ──ack──▶ starting
--     ▲  ▲                     │ not acked within reclaim_older_than_ms:
--     │  └─────────────────────┘ the next poll hands it out again
--     │                                                   │ heartbeat
--     │ lease expired (no heartbeat within its TTL)       ▼
--     └──────────────────────────────────────────────── active
--                                                         │ stop
--                              stopping ◀── graceful ─────┤
--                                 │ stop (force)          │ force
--                                 ▼                       ▼
--                               stopped ◀──────────────────
--
-- last_heartbeat is the lease's compare token: a heartbeat names the one it
-- last got back (or NO_HEARTBEAT for the first) and a mismatch is a 412.
--
-- An environment key is an API key with environment_id set: it belongs to a
-- service principal with no roles and authorizes only its environment's work
-- and the event routes of that environment's sessions (package authz).

-- +goose Up
ALTER TABLE sessions ADD COLUMN self_hosted boolean NOT NULL DEFAULT false;

ALTER TABLE api_keys ADD COLUMN environment_id text;

CREATE TABLE environment_work (
    tenant_id           text        NOT NULL REFERENCES tenants (id),
    id                  text        NOT NULL,
    environment_id      text        NOT NULL,
    session_id          text        NOT NULL,
    state               text        NOT NULL DEFAULT 'queued'
                        CHECK (state IN ('queued', 'starting', 'active', 'stopping', 'stopped')),
    metadata            jsonb       NOT NULL DEFAULT '{}',
    -- The Anthropic-Worker-ID of the last poll that handed it out.
    worker_id           text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- When a poll last handed it out while queued (pending an ack).
    polled_at           timestamptz,
    acknowledged_at     timestamptz,
    started_at          timestamptz,
    latest_heartbeat_at timestamptz,
    last_heartbeat      text,
    lease_expires_at    timestamptz,
    stop_requested_at   timestamptz,
    stopped_at          timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX environment_work_live ON environment_work (tenant_id, session_id) WHERE state <> 'stopped';
CREATE INDEX environment_work_queue ON environment_work (tenant_id, environment_id, created_at, id) WHERE state <> 'stopped';
CREATE INDEX environment_work_newest ON environment_work (tenant_id, environment_id, created_at DESC, id DESC);

ALTER TABLE environment_work ENABLE ROW LEVEL SECURITY;
ALTER TABLE environment_work FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON environment_work
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
GRANT SELECT, INSERT, UPDATE ON environment_work TO corral_app;

-- Who polled an environment lately (the queue stats' workers_polling).
CREATE TABLE environment_workers (
    tenant_id      text        NOT NULL REFERENCES tenants (id),
    environment_id text        NOT NULL,
    worker_id      text        NOT NULL,
    last_poll_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, environment_id, worker_id)
);
ALTER TABLE environment_workers ENABLE ROW LEVEL SECURITY;
ALTER TABLE environment_workers FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON environment_workers
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
GRANT SELECT, INSERT, UPDATE, DELETE ON environment_workers TO corral_app;

DROP FUNCTION authenticate_api_key(bytea);
-- +goose StatementBegin
CREATE FUNCTION authenticate_api_key(key_hash bytea)
RETURNS TABLE (tenant_id text, key_id text, principal_id text, principal text, roles text[],
               tenant_status text, revoked boolean, disabled boolean, last_used_at timestamptz,
               environment_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT k.tenant_id, k.id, p.id, p.kind || ':' || p.name, p.roles, t.status,
           k.revoked_at IS NOT NULL, p.disabled_at IS NOT NULL, k.last_used_at, k.environment_id
    FROM api_keys k
    JOIN tenants t ON t.id = k.tenant_id
    JOIN principals p ON p.tenant_id = k.tenant_id AND p.id = k.principal_id
    WHERE k.secret_hash = key_hash
    UNION ALL
    SELECT NULL, o.id, NULL, o.principal, o.roles, NULL, o.revoked_at IS NOT NULL, false, o.last_used_at, NULL
    FROM operator_keys o
    WHERE o.secret_hash = key_hash
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION authenticate_api_key(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION authenticate_api_key(bytea) TO corral_app;

-- +goose Down
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
DROP TABLE environment_workers;
DROP TABLE environment_work;
ALTER TABLE api_keys DROP COLUMN environment_id;
ALTER TABLE sessions DROP COLUMN self_hosted;
