-- name: AddWorkspaceSnapshot :exec
INSERT INTO workspace_snapshots (tenant_id, session_id, seq, blob_key, full_copy, origin, host_id, sandbox_id, taken_at, files, bytes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: ListWorkspaceSnapshots :many
SELECT * FROM workspace_snapshots WHERE tenant_id = $1 AND session_id = $2 ORDER BY seq;

-- name: DeleteWorkspaceSnapshotsBefore :exec
DELETE FROM workspace_snapshots WHERE tenant_id = $1 AND session_id = $2 AND seq < $3;
