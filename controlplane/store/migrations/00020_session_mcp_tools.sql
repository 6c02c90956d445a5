-- The MCP tools a session pinned: what each MCP server of the session's
-- agent offered when the session first reached it. Later turns offer the
-- model the same tools even if the server changes its list; a server that
-- could not be reached has no row and is tried again at the next turn.

-- +goose Up
CREATE TABLE session_mcp_tools (
    tenant_id   text        NOT NULL,
    session_id  text        NOT NULL,
    server_name text        NOT NULL,
    -- JSON array of {name, description, input_schema}.
    tools       jsonb       NOT NULL,
    pinned_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, session_id, server_name),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

ALTER TABLE session_mcp_tools ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_mcp_tools FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON session_mcp_tools
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

-- Pins never change: the first one wins.
GRANT SELECT, INSERT ON session_mcp_tools TO corral_app;

-- +goose Down
DROP TABLE session_mcp_tools;
