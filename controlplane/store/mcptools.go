package store

import (
	"context"

	"corral.dev/corral/controlplane/store/internal/db"
)

// PinMCPTools records the tools (a JSON array) an MCP server offered the
// session. The first pin of a server wins; later ones change nothing.
func (r Events) PinMCPTools(ctx context.Context, sessionID, server string, tools []byte) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		err := q.PinSessionMCPTools(ctx, db.PinSessionMCPToolsParams{TenantID: tid, SessionID: sessionID, ServerName: server, Tools: tools})
		return translate(err, "MCP tools of session "+sessionID)
	})
}

// MCPTools returns the session's pinned MCP tools by server name, each a
// JSON array.
func (r Events) MCPTools(ctx context.Context, sessionID string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListSessionMCPTools(ctx, db.ListSessionMCPToolsParams{TenantID: tid, SessionID: sessionID})
		for _, row := range rows {
			out[row.ServerName] = row.Tools
		}
		return translate(err, "MCP tools of session "+sessionID)
	})
	return out, err
}
