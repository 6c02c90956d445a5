-- Usage metering for billing (controlplane/usage):
--
-- usage_model_tokens: each session's model tokens by model and UTC hour,
-- added in the transaction that appends the model request's events (so a
-- retried append that fails on its event ids adds nothing twice).
--
-- usage_sandbox_intervals: the time a session's sandbox spent running or
-- paused on a host, as intervals the Raft leader's meter opens and closes
-- from the placements it sees. At most one interval per session is open
-- (the partial unique index): a new leader that replays what it sees
-- opens nothing twice. Reads close open intervals at their own now.
--
-- usage_meter fences the meter: the Raft term of the last leader that
-- metered. A leader claims its term before it reads the open intervals,
-- and every write checks it under the row's lock, so a deposed leader's
-- late write is refused.
--
-- Session ids are not foreign keys: a deleted session's usage stays
-- billable. A deleted tenant's goes with it.
--
-- usage_rows(...) is the report both the tenant's admins (in their
-- tenant's transaction, under row-level security) and operators
-- (usage_rows_all, SECURITY DEFINER, through the owner policies) read.

-- +goose Up
CREATE TABLE usage_model_tokens (
    tenant_id                   text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    session_id                  text        NOT NULL,
    model                       text        NOT NULL,
    hour                        timestamptz NOT NULL,
    input_tokens                bigint      NOT NULL DEFAULT 0,
    output_tokens               bigint      NOT NULL DEFAULT 0,
    cache_read_input_tokens     bigint      NOT NULL DEFAULT 0,
    cache_creation_input_tokens bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, hour, session_id, model)
);
CREATE INDEX usage_model_tokens_hour ON usage_model_tokens (hour);

CREATE TABLE usage_sandbox_intervals (
    id         bigserial   PRIMARY KEY,
    tenant_id  text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    session_id text        NOT NULL,
    state      text        NOT NULL CHECK (state IN ('running', 'paused')),
    host_id    text        NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz CHECK (ended_at >= started_at)
);
CREATE UNIQUE INDEX usage_sandbox_intervals_open ON usage_sandbox_intervals (tenant_id, session_id) WHERE ended_at IS NULL;
CREATE INDEX usage_sandbox_intervals_started ON usage_sandbox_intervals (tenant_id, started_at);
CREATE INDEX usage_sandbox_intervals_ended ON usage_sandbox_intervals (ended_at);

ALTER TABLE usage_model_tokens ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_model_tokens FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_model_tokens
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
CREATE POLICY owner_read ON usage_model_tokens FOR SELECT TO CURRENT_USER USING (true);
GRANT SELECT, INSERT, UPDATE ON usage_model_tokens TO corral_app;

ALTER TABLE usage_sandbox_intervals ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_sandbox_intervals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_sandbox_intervals
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
CREATE POLICY owner_read ON usage_sandbox_intervals FOR SELECT TO CURRENT_USER USING (true);
GRANT SELECT, INSERT, UPDATE ON usage_sandbox_intervals TO corral_app;
GRANT USAGE ON SEQUENCE usage_sandbox_intervals_id_seq TO corral_app;

CREATE TABLE usage_meter (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    term bigint  NOT NULL DEFAULT 0
);
INSERT INTO usage_meter DEFAULT VALUES;
GRANT SELECT, UPDATE ON usage_meter TO corral_app;

-- The report: per bucket of p_unit ('hour' or 'day', UTC) within
-- [p_start, p_end), per tenant, session and model, the tokens; per
-- tenant and session (model ''), the sandbox's running and paused
-- seconds, open intervals counted up to p_now. p_tenant NULL: every
-- tenant the caller may see.
-- +goose StatementBegin
CREATE FUNCTION usage_rows(p_tenant text, p_start timestamptz, p_end timestamptz, p_unit text, p_now timestamptz)
RETURNS TABLE (bucket timestamptz, tenant_id text, session_id text, model text,
               input_tokens bigint, output_tokens bigint, cache_read_input_tokens bigint, cache_creation_input_tokens bigint,
               running_seconds float8, paused_seconds float8)
LANGUAGE sql STABLE SET search_path = public AS $$
    WITH b AS (
        SELECT g AS b_start, g + ('1 ' || p_unit)::interval AS b_end
        FROM generate_series(date_trunc(p_unit, p_start, 'UTC'), p_end - interval '1 microsecond', ('1 ' || p_unit)::interval) g
    ), t AS (
        SELECT date_trunc(p_unit, u.hour, 'UTC') AS bucket, u.tenant_id, u.session_id, u.model,
               sum(u.input_tokens)::bigint, sum(u.output_tokens)::bigint,
               sum(u.cache_read_input_tokens)::bigint, sum(u.cache_creation_input_tokens)::bigint,
               0::float8, 0::float8
        FROM usage_model_tokens u
        WHERE (p_tenant IS NULL OR u.tenant_id = p_tenant) AND u.hour >= p_start AND u.hour < p_end
        GROUP BY 1, 2, 3, 4
    ), s AS (
        SELECT b.b_start AS bucket, i.tenant_id, i.session_id, ''::text,
               0::bigint, 0::bigint, 0::bigint, 0::bigint,
               COALESCE(sum(x.secs) FILTER (WHERE i.state = 'running'), 0)::float8,
               COALESCE(sum(x.secs) FILTER (WHERE i.state = 'paused'), 0)::float8
        FROM usage_sandbox_intervals i
        JOIN b ON i.started_at < b.b_end AND COALESCE(i.ended_at, p_now) > b.b_start
        CROSS JOIN LATERAL (SELECT GREATEST(0, extract(epoch FROM
            LEAST(COALESCE(i.ended_at, p_now), b.b_end, p_end) - GREATEST(i.started_at, b.b_start, p_start)))::float8 AS secs) x
        WHERE (p_tenant IS NULL OR i.tenant_id = p_tenant)
          AND i.started_at < p_end AND i.started_at <= p_now AND (i.ended_at IS NULL OR i.ended_at > p_start)
        GROUP BY 1, 2, 3
    )
    SELECT * FROM t UNION ALL SELECT * FROM s
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION usage_rows(text, timestamptz, timestamptz, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION usage_rows(text, timestamptz, timestamptz, text, timestamptz) TO corral_app;

-- Operators' report over every tenant (or one), through the owner
-- policies above.
-- +goose StatementBegin
CREATE FUNCTION usage_rows_all(p_tenant text, p_start timestamptz, p_end timestamptz, p_unit text, p_now timestamptz)
RETURNS TABLE (bucket timestamptz, tenant_id text, session_id text, model text,
               input_tokens bigint, output_tokens bigint, cache_read_input_tokens bigint, cache_creation_input_tokens bigint,
               running_seconds float8, paused_seconds float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT * FROM usage_rows(p_tenant, p_start, p_end, p_unit, p_now)
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION usage_rows_all(text, timestamptz, timestamptz, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION usage_rows_all(text, timestamptz, timestamptz, text, timestamptz) TO corral_app;

-- The open intervals of every tenant, for a meter that begins to lead.
-- +goose StatementBegin
CREATE FUNCTION open_sandbox_intervals()
RETURNS TABLE (tenant_id text, session_id text, state text, host_id text, started_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT tenant_id, session_id, state, host_id, started_at FROM usage_sandbox_intervals WHERE ended_at IS NULL
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION open_sandbox_intervals() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION open_sandbox_intervals() TO corral_app;

-- +goose Down
DROP FUNCTION open_sandbox_intervals();
DROP FUNCTION usage_rows_all(text, timestamptz, timestamptz, text, timestamptz);
DROP FUNCTION usage_rows(text, timestamptz, timestamptz, text, timestamptz);
DROP TABLE usage_meter;
DROP TABLE usage_sandbox_intervals;
DROP TABLE usage_model_tokens;
