-- When a running session last went running: the status change that ends
-- the run adds the time since to active_seconds (stats.active_seconds, the
-- time the session spent running), and a read of a running session adds
-- the run so far. NULL when the session is not running.

-- +goose Up
ALTER TABLE sessions ADD COLUMN running_since timestamptz;
UPDATE sessions SET running_since = updated_at WHERE status = 'running';

-- +goose Down
ALTER TABLE sessions DROP COLUMN running_since;
