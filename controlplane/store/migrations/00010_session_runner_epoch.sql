-- Session runners: the Raft leader assigns each session's agent loop to one
-- control-plane node with an epoch that grows on every reassignment. The
-- runner claims its epoch here, and every append the loop makes checks it in
-- the same transaction as the insert, so a runner that lost its assignment
-- (a partitioned or slow node) cannot append anything once a newer one has
-- claimed the session. Client appends through the API do not check it.

-- +goose Up
ALTER TABLE sessions ADD COLUMN runner_epoch bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE sessions DROP COLUMN runner_epoch;
