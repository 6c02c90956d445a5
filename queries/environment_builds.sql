-- name: RequestBuild :one
-- A build of that key is asked for: made pending if new. A failed one is
-- asked for again once it has been failed for retry_seconds (a mirror
-- that was down); any other is left as it is.
INSERT INTO environment_builds (tenant_id, key, image, base_image, packages, mirrors, environment_id)
VALUES (sqlc.arg(tenant_id), sqlc.arg(key), sqlc.arg(image), sqlc.arg(base_image), sqlc.arg(packages), sqlc.arg(mirrors), sqlc.arg(environment_id))
ON CONFLICT (tenant_id, key) DO UPDATE SET
    status = 'pending', error = '', finished_at = NULL, requested_at = now()
    WHERE environment_builds.status = 'failed'
      AND environment_builds.finished_at < now() - make_interval(secs => sqlc.arg(retry_seconds)::double precision)
RETURNING *;

-- name: GetBuild :one
SELECT * FROM environment_builds WHERE tenant_id = $1 AND key = $2;

-- name: ClaimBuild :one
-- The builder takes a pending build, or one whose builder stopped before
-- stale_before.
UPDATE environment_builds SET status = 'building', attempts = attempts + 1, started_at = now(), log = '', error = '', host_id = ''
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key)
  AND (status = 'pending' OR (status = 'building' AND started_at < sqlc.arg(stale_before)::timestamptz))
RETURNING *;

-- name: SetBuildProgress :exec
-- The running build's log so far (and its host); started_at moves with
-- it, so a build that makes progress is never taken as stale.
UPDATE environment_builds SET log = sqlc.arg(log), host_id = sqlc.arg(host_id), started_at = now()
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key) AND status = 'building';

-- name: FinishBuild :exec
UPDATE environment_builds SET status = sqlc.arg(status), error = sqlc.arg(error), log = sqlc.arg(log), host_id = sqlc.arg(host_id),
    digest = sqlc.arg(digest), layer_bytes = sqlc.arg(layer_bytes), blob_key = sqlc.arg(blob_key), finished_at = now()
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key) AND status = 'building';

-- name: ListBuilds :many
SELECT * FROM environment_builds
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.arg(key)::text = '' OR key = sqlc.arg(key)::text)
ORDER BY created_at DESC, key
LIMIT sqlc.arg(lim);

-- name: RequeueBuild :exec
-- A running build that could not run now (its host busy or gone) is
-- pending again, for the builder's next look.
UPDATE environment_builds SET status = 'pending', log = sqlc.arg(log), host_id = '', started_at = NULL
WHERE tenant_id = sqlc.arg(tenant_id) AND key = sqlc.arg(key) AND status = 'building';

-- name: CountOpenBuilds :one
SELECT count(*) FROM environment_builds
WHERE tenant_id = $1 AND status IN ('pending', 'building');

-- name: TouchBuild :exec
-- The build was asked for again: not sweepable for a while.
UPDATE environment_builds SET requested_at = now() WHERE tenant_id = $1 AND key = $2;

-- name: DeleteBuild :execrows
-- The sweep's last step, for a build still unused since requested_before
-- (a session pins it, or it was asked for again, meanwhile: kept).
DELETE FROM environment_builds b
WHERE b.tenant_id = sqlc.arg(tenant_id) AND b.key = sqlc.arg(key) AND b.requested_at < sqlc.arg(requested_before)::timestamptz
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.tenant_id = sqlc.arg(tenant_id) AND s.package_build = b.key);
