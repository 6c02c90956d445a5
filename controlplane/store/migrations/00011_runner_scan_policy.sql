-- sessions_needing_runner() (00003) lists, across tenants, the sessions whose
-- agent loop has work, for nodes resuming loops at start and after a runner
-- reassignment. It runs as its owner, SECURITY DEFINER, but row-level
-- security is forced on sessions and events, so with no tenant set it saw no
-- rows at all. These policies let the owner role (the one that migrates and
-- owns the function) read every tenant's sessions and events; the
-- application role is unaffected and still sees only its tenant's rows.

-- +goose Up
CREATE POLICY runner_scan ON sessions FOR SELECT TO CURRENT_USER USING (true);
CREATE POLICY runner_scan ON events FOR SELECT TO CURRENT_USER USING (true);

-- +goose Down
DROP POLICY runner_scan ON events;
DROP POLICY runner_scan ON sessions;
