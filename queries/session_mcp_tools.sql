-- name: PinSessionMCPTools :exec
-- The first pin of a server wins.
INSERT INTO session_mcp_tools (tenant_id, session_id, server_name, tools)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, session_id, server_name) DO NOTHING;

-- name: ListSessionMCPTools :many
SELECT server_name, tools FROM session_mcp_tools WHERE tenant_id = $1 AND session_id = $2 ORDER BY server_name;
