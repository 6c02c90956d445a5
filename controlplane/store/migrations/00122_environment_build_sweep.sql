-- Environment builds no session uses are swept: requested_at is when a
-- build was last asked for (an environment create or update, a session
-- create), and sweepable_environment_builds returns, across tenants, the
-- finished builds asked for before a time that no session pins. The
-- leader's sweep removes their images from the hosts and the blob store,
-- then the row (a session asking again builds again).

-- +goose Up
ALTER TABLE environment_builds ADD COLUMN requested_at timestamptz NOT NULL DEFAULT now();
GRANT DELETE ON environment_builds TO corral_app;

-- SECURITY DEFINER, as claimable_environment_builds (00121): the owner
-- reads every tenant's builds (builder_scan) and sessions (runner_scan).
CREATE FUNCTION sweepable_environment_builds(requested_before timestamptz, lim integer)
RETURNS TABLE (tenant_id text, key text, image text, blob_key text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT b.tenant_id, b.key, b.image, b.blob_key FROM environment_builds b
    WHERE b.status IN ('ready', 'failed') AND b.requested_at < requested_before
      AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.tenant_id = b.tenant_id AND s.package_build = b.key)
    ORDER BY b.requested_at
    LIMIT lim
$$;
REVOKE ALL ON FUNCTION sweepable_environment_builds(timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweepable_environment_builds(timestamptz, integer) TO corral_app;

-- +goose Down
DROP FUNCTION sweepable_environment_builds(timestamptz, integer);
REVOKE DELETE ON environment_builds FROM corral_app;
ALTER TABLE environment_builds DROP COLUMN requested_at;
