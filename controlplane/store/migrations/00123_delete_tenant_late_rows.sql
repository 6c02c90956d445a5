-- delete_tenant removes the tenant in its passes, not after them.
--
-- A row written for the tenant while it was being deleted (the audit log's
-- writer appends in the background: the record of a request made just
-- before the delete) could land between the function's last pass and its
-- delete of the tenant, whose foreign key then refused the whole delete.
-- Now a refused delete of the tenant is one more pass, which removes what
-- was written meanwhile. (Taking the tenant's row lock first would keep
-- such rows out, but a session's append, which holds its session's row
-- and then checks the tenant's key, would deadlock with the passes.)

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION delete_tenant(tid text) RETURNS void
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
        IF blocked = 0 THEN
            -- The tenant's audit trail goes with it; the deletion itself
            -- is recorded as a fleet row by the caller.
            DELETE FROM audit_log WHERE tenant_id = tid;
            BEGIN
                DELETE FROM tenants WHERE id = tid;
            EXCEPTION WHEN foreign_key_violation THEN
                -- A row written for the tenant meanwhile (the audit
                -- log's writer appends in the background): another pass.
                blocked := 1;
            END;
        END IF;
        EXIT WHEN blocked = 0;
        passes := passes + 1;
        IF passes > 20 THEN
            RAISE EXCEPTION 'tenant %: rows still referenced after % passes', tid, passes;
        END IF;
    END LOOP;
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION delete_tenant(tid text) RETURNS void
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
