-- The session event log. Every event a session sees, client-sent or emitted
-- by the agent loop, is one row with a per-session sequence number, appended
-- in the same transaction as the session change it causes. Streams resume by
-- sequence, so a reconnecting client misses nothing and sees nothing twice.

-- +goose Up
ALTER TABLE sessions ADD COLUMN last_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE events (
    tenant_id    text        NOT NULL,
    session_id   text        NOT NULL,
    seq          bigint      NOT NULL CHECK (seq >= 1),
    id           text        NOT NULL,
    type         text        NOT NULL,
    -- The event as the API returns it, without processed_at.
    body         jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL while a client event waits in the queue; set when the agent loop
    -- consumes it. Events the loop emits are processed when written.
    processed_at timestamptz,
    PRIMARY KEY (tenant_id, session_id, seq),
    CONSTRAINT events_id_unique UNIQUE (tenant_id, session_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);
-- The loop and its recovery look for queued client events.
CREATE INDEX events_queued ON events (tenant_id, session_id, seq) WHERE processed_at IS NULL;

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON events
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

-- Events are append-only; only processed_at ever changes.
GRANT SELECT, INSERT ON events TO corral_app;
GRANT UPDATE (processed_at) ON events TO corral_app;

-- Sessions that need their loop run, across tenants, for recovery after a
-- restart. SECURITY DEFINER so the application role can find them without
-- seeing any tenant's rows; it returns ids and tenants only.
CREATE FUNCTION sessions_needing_runner() RETURNS TABLE (tenant_id text, session_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT s.tenant_id, s.id FROM sessions s
    WHERE s.status = 'running'
       OR EXISTS (SELECT 1 FROM events e
                  WHERE e.tenant_id = s.tenant_id AND e.session_id = s.id AND e.processed_at IS NULL)
$$;
REVOKE ALL ON FUNCTION sessions_needing_runner() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sessions_needing_runner() TO corral_app;

-- +goose Down
DROP FUNCTION sessions_needing_runner();
DROP TABLE events;
ALTER TABLE sessions DROP COLUMN last_seq;
