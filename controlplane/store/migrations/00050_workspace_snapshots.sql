-- The snapshots of a session's workspace, taken to the blob store after
-- every turn that may have changed it. A chain is a full copy followed by
-- increments (the files changed since the one before; the others listed
-- without their content); restoring composes the chain into one archive.
-- The chain belongs to one sandbox: the increments compare against its
-- host's clock (taken_at), so a sandbox placed anew starts a new chain.

-- +goose Up
CREATE TABLE workspace_snapshots (
    tenant_id  text        NOT NULL,
    session_id text        NOT NULL,
    seq        bigint      NOT NULL,
    blob_key   text        NOT NULL,
    full_copy  boolean     NOT NULL,
    -- What took it: 'turn' (a turn's end), 'running' (a long command),
    -- 'evicted' (what the host kept of an evicted sandbox), 'restored'
    -- (a restore's composed copy, the new sandbox's first).
    origin     text        NOT NULL,
    host_id    text        NOT NULL,
    sandbox_id text        NOT NULL,
    -- The host's clock when it began listing the workspace: the next
    -- increment holds the files changed (ctime) since.
    taken_at   timestamptz NOT NULL,
    files      bigint      NOT NULL,
    bytes      bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, session_id, seq),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

ALTER TABLE workspace_snapshots ENABLE ROW LEVEL SECURITY;
ALTER TABLE workspace_snapshots FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON workspace_snapshots
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT SELECT, INSERT, DELETE ON workspace_snapshots TO corral_app;

-- +goose Down
DROP TABLE workspace_snapshots;
