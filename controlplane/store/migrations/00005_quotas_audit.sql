-- Per-tenant quota overrides (NULL: the policy's default applies) and the
-- audit log.
--
-- Audit rows of a tenant carry its tenant_id and are readable by that tenant
-- through tenant_isolation; rows about the fleet or about requests that never
-- reached a tenant (tenant_id NULL) are written and read through the
-- functions below, which operators' requests use.

-- +goose Up
CREATE TABLE tenant_quotas (
    tenant_id            text        PRIMARY KEY REFERENCES tenants (id),
    concurrent_sessions  integer     CHECK (concurrent_sessions > 0),
    concurrent_sandboxes integer     CHECK (concurrent_sandboxes > 0),
    cpu_millis           integer     CHECK (cpu_millis > 0),
    memory_mib           integer     CHECK (memory_mib > 0),
    requests_per_second  integer     CHECK (requests_per_second > 0),
    request_burst        integer     CHECK (request_burst > 0),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE tenant_quotas ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_quotas FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_quotas
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
GRANT SELECT, INSERT, UPDATE ON tenant_quotas TO corral_app;

CREATE TABLE audit_log (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- NULL for fleet actions and requests that named no tenant. A record
    -- queued for a tenant deleted meanwhile is refused, not left behind.
    tenant_id   text        REFERENCES tenants (id),
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text        NOT NULL,
    action      text        NOT NULL,
    resource    text        NOT NULL,
    outcome     text        NOT NULL,
    remote_addr text        NOT NULL,
    request_id  text        NOT NULL
);
CREATE INDEX audit_log_by_tenant ON audit_log (tenant_id, id);
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_log FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_log
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('CREATE POLICY owner_access ON audit_log TO %I USING (true)', current_user);
END $$;
-- +goose StatementEnd
GRANT SELECT, INSERT ON audit_log TO corral_app;

-- Appends a fleet-level audit row (tenant_id NULL).
-- +goose StatementBegin
CREATE FUNCTION audit_fleet(p_principal text, p_action text, p_resource text, p_outcome text, p_remote_addr text, p_request_id text)
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public AS $$
    INSERT INTO audit_log (tenant_id, principal, action, resource, outcome, remote_addr, request_id)
    VALUES (NULL, p_principal, p_action, p_resource, p_outcome, p_remote_addr, p_request_id)
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION audit_fleet(text, text, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_fleet(text, text, text, text, text, text) TO corral_app;

-- The whole log, newest first, for operators: rows with ids below before_id
-- (0: from the newest), of one tenant when p_tenant is set.
-- +goose StatementBegin
CREATE FUNCTION list_audit(p_tenant text, before_id bigint, lim integer)
RETURNS SETOF audit_log
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT * FROM audit_log
    WHERE (p_tenant IS NULL OR tenant_id = p_tenant)
      AND (before_id <= 0 OR id < before_id)
    ORDER BY id DESC
    LIMIT lim
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION list_audit(text, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION list_audit(text, bigint, integer) TO corral_app;

-- +goose Down
DROP FUNCTION list_audit(text, bigint, integer);
DROP FUNCTION audit_fleet(text, text, text, text, text, text);
DROP TABLE audit_log;
DROP TABLE tenant_quotas;
