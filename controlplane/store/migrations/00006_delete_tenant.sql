-- Deleting a tenant with everything it owns.
--
-- delete_tenant walks every table with a tenant_id column (so tables later
-- migrations add are covered without a change here), deleting the tenant's
-- rows in passes until foreign keys stop refusing, ends the event streams of
-- its sessions, and removes the tenant. It runs in the tenant's own scope
-- (it sets corral.tenant_id), so row-level security still confines it.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION delete_tenant(tid text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public AS $$
DECLARE
    tbl       text;
    blocked   integer;
    passes    integer := 0;
BEGIN
    IF tid IS NULL THEN
        RAISE EXCEPTION 'tenant % cannot be deleted', tid USING ERRCODE = 'check_violation';
    END IF;
    PERFORM set_config('corral.tenant_id', tid, true);
    -- Open streams of the tenant's sessions end when this commits.
    PERFORM pg_notify('corral_events', s.id || ':deleted') FROM sessions s WHERE s.tenant_id = tid;
    LOOP
        blocked := 0;
        FOR tbl IN
            SELECT c.relname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
            WHERE c.relkind IN ('r', 'p')
              AND EXISTS (SELECT 1 FROM pg_attribute a
                          WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
              AND c.relname <> 'audit_log'
            ORDER BY c.relname
        LOOP
            BEGIN
                EXECUTE format('DELETE FROM %I WHERE tenant_id = $1', tbl) USING tid;
            EXCEPTION WHEN foreign_key_violation THEN
                blocked := blocked + 1;
            END;
        END LOOP;
        EXIT WHEN blocked = 0;
        passes := passes + 1;
        IF passes > 20 THEN
            RAISE EXCEPTION 'tenant %: rows still referenced after % passes', tid, passes;
        END IF;
    END LOOP;
    -- The tenant's audit trail goes with it; the deletion itself is
    -- recorded as a fleet row by the caller.
    DELETE FROM audit_log WHERE tenant_id = tid;
    DELETE FROM tenants WHERE id = tid;
END $$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION delete_tenant(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION delete_tenant(text) TO corral_app;

-- +goose Down
DROP FUNCTION delete_tenant(text);
