-- Environment package builds: an environment's packages installed once per
-- content key (envbuild.Key: tenant, base image, package lists, mirrors)
-- into an image a host builds. A session pins the key of its environment's
-- packages when it is created (sessions.package_build) and its sandbox
-- runs that build's image; an environment update that changes the
-- packages makes a new key, so only new sessions get the new build.
-- Tenant rows under row-level security; the leader's builder finds the
-- builds to run in every tenant through claimable_environment_builds.

-- +goose Up
CREATE TABLE environment_builds (
    tenant_id      text        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key            text        NOT NULL,
    -- The image the build makes (envbuild.ImageRef) and the one it builds on.
    image          text        NOT NULL,
    base_image     text        NOT NULL,
    -- What the builder plans the steps from: the package lists
    -- (envbuild.Packages) and the specs of the mirrors they come from, as
    -- they were when the build was asked for (both are in the key).
    packages       jsonb       NOT NULL,
    mirrors        jsonb       NOT NULL,
    -- The environment that first asked for it (builds are shared by key).
    environment_id text        NOT NULL,
    status         text        NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'building', 'ready', 'failed')),
    -- Why it failed, for the tenant; the build's log, its last 64 KiB.
    error          text        NOT NULL DEFAULT '',
    log            text        NOT NULL DEFAULT '',
    -- The host that built it, the image's manifest digest, its layer's
    -- size and the blob store key of its exported archive ('' none).
    host_id        text        NOT NULL DEFAULT '',
    digest         text        NOT NULL DEFAULT '',
    layer_bytes    bigint      NOT NULL DEFAULT 0,
    blob_key       text        NOT NULL DEFAULT '',
    attempts       integer     NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    finished_at    timestamptz,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX environment_builds_open ON environment_builds (created_at) WHERE status IN ('pending', 'building');
ALTER TABLE environment_builds ENABLE ROW LEVEL SECURITY;
ALTER TABLE environment_builds FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON environment_builds
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
GRANT SELECT, INSERT, UPDATE ON environment_builds TO corral_app;
-- The owner (the migrating role, which claimable_environment_builds runs
-- as) reads every tenant's builds, as runner_scan (00011) on sessions.
CREATE POLICY builder_scan ON environment_builds FOR SELECT TO CURRENT_USER USING (true);

ALTER TABLE sessions ADD COLUMN package_build text NOT NULL DEFAULT '';

-- claimable_environment_builds returns, across tenants, the builds the
-- leader's builder may start: pending ones, and building ones whose
-- builder stopped before stale_before (a leader that died mid-build).
-- Tenants take turns: each tenant's oldest first, then each one's second
-- oldest, and so on, so one tenant's many builds never hold back
-- another's first. SECURITY DEFINER, as existing_sessions (00030): the
-- application role learns the tenant and key of those rows and nothing
-- else; it claims and runs each in its tenant's scope.
CREATE FUNCTION claimable_environment_builds(stale_before timestamptz, lim integer)
RETURNS TABLE (tenant_id text, key text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT c.tenant_id, c.key FROM (
        SELECT b.tenant_id, b.key, b.created_at,
               row_number() OVER (PARTITION BY b.tenant_id ORDER BY b.created_at, b.key) AS turn
        FROM environment_builds b
        WHERE b.status = 'pending' OR (b.status = 'building' AND b.started_at < stale_before)
    ) c
    ORDER BY c.turn, c.created_at, c.key
    LIMIT lim
$$;
REVOKE ALL ON FUNCTION claimable_environment_builds(timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claimable_environment_builds(timestamptz, integer) TO corral_app;

-- +goose Down
DROP FUNCTION claimable_environment_builds(timestamptz, integer);
DROP POLICY builder_scan ON environment_builds;
ALTER TABLE sessions DROP COLUMN package_build;
DROP TABLE environment_builds;
