-- The egress audit trail: every connection a sandbox opened through its
-- host's egress proxy, carried or refused, as the host reported it in a
-- heartbeat. Tenant rows under row-level security; a tenant's rows go
-- with it.

-- +goose Up
CREATE TABLE egress_connections (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    session_id  text        NOT NULL,
    host_id     text        NOT NULL,
    dest_host   text        NOT NULL,
    dest_port   integer     NOT NULL,
    -- The address the proxy dialled; '' when it dialled none.
    address     text        NOT NULL,
    allowed     boolean     NOT NULL,
    reason      text        NOT NULL,
    bytes_up    bigint      NOT NULL,
    bytes_down  bigint      NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX egress_connections_by_session ON egress_connections (tenant_id, session_id, id);
CREATE INDEX egress_connections_by_tenant ON egress_connections (tenant_id, id);
ALTER TABLE egress_connections ENABLE ROW LEVEL SECURITY;
ALTER TABLE egress_connections FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON egress_connections
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
GRANT SELECT, INSERT ON egress_connections TO corral_app;

-- +goose Down
DROP TABLE egress_connections;
