package agentloop

// The step that runs tools: built-in tools in the sandbox, retried while
// their errors are transient, and MCP tools through the MCP client, whose
// servers are discovered and pinned at a turn's start.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"corral.dev/corral/internal/errdefs"
)

// discoverMCP lists the tools of the MCP servers the session has not
// pinned yet and pins them, and reports whether it pinned any. A server
// that cannot be reached is reported (mcp_connection_failed_error) and
// tried again when the next turn starts; its tools are missing from this
// turn. A pin that cannot be stored is the step's error: the server
// answered, and the step is tried again.
func (r *Loop) discoverMCP(ctx context.Context, sessionID string, agent Agent) (evs []Out, pinned bool, err error) {
	if r.MCP == nil {
		return nil, false, nil
	}
	for _, srv := range UndiscoveredMCPServers(agent) {
		var tools []MCPTool
		err := errors.New("the agent has no mcp_servers entry of that name")
		if srv.URL != "" {
			tools, err = r.MCP.ListTools(ctx, sessionID, srv)
		}
		if err == nil {
			if err := r.Store.PinMCPTools(ctx, sessionID, srv.Name, tools); err != nil {
				return nil, pinned, fmt.Errorf("pinning the tools of MCP server %s: %w", srv.Name, err)
			}
			pinned = true
			continue
		}
		if ctx.Err() != nil {
			return nil, pinned, nil
		}
		typ := "mcp_connection_failed_error"
		if errors.Is(err, ErrMCPAuthentication) {
			typ = "mcp_authentication_failed_error"
		}
		evs = append(evs, r.errorEvent(ErrorInfo{
			Type:          typ,
			Message:       fmt.Sprintf("MCP server %s: listing its tools: %v; its tools are not available this turn", srv.Name, err),
			MCPServerName: srv.Name,
			RetryStatus:   "exhausted",
		}))
	}
	return evs, pinned, nil
}

// runMCP calls one MCP tool. A server that cannot be asked is a result
// with is_error: the model can go on without it.
func (r *Loop) runMCP(ctx context.Context, sessionID string, agent Agent, c ToolCall) (ToolResult, error) {
	fail := func(format string, args ...any) (ToolResult, error) {
		return ToolResult{Content: textBlocks(fmt.Sprintf(format, args...)), IsError: true}, nil
	}
	if r.MCP == nil {
		return fail("MCP tools are not available on this server")
	}
	var srv MCPServer
	for _, s := range agent.MCPServers {
		if s.Name == c.MCPServer {
			srv = s
		}
	}
	if srv.URL == "" {
		return fail("the agent has no MCP server named %s", c.MCPServer)
	}
	res, err := r.MCP.CallTool(ctx, sessionID, srv, c.Name, c.Input)
	if err != nil {
		if ctx.Err() != nil {
			return ToolResult{}, ctx.Err()
		}
		return fail("MCP server %s could not be reached: %v", srv.Name, err)
	}
	return res, nil
}

func (r *Loop) runTools(ctx context.Context, sessionID string, s *session, a RunTools) error {
	var evs []Out
	if a.NeedRunning {
		evs = append(evs, r.out(StatusRunning, nil))
	}
	for _, c := range a.Calls {
		if c.MCPServer != "" {
			res := ToolResult{Content: textBlocks(c.DenyMessage), IsError: true}
			if !c.Deny {
				var err error
				if res, err = r.runMCP(ctx, sessionID, s.agent, c); err != nil {
					return err
				}
			}
			evs = append(evs, r.out(AgentMCPToolResult, map[string]any{"mcp_tool_use_id": c.EventID, "content": storableBlocks(res.Content), "is_error": res.IsError}))
			continue
		}
		if c.Deny {
			evs = append(evs, r.out(AgentToolResult, map[string]any{"tool_use_id": c.EventID, "content": textBlocks(c.DenyMessage), "is_error": true}))
			continue
		}
		res, err := r.runTool(ctx, sessionID, c)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.logger().Warn("a tool call failed; the turn ends with a session.error", "session_id", sessionID, "tool", c.Name, "err", err)
			evs = append(evs,
				r.errorEvent(ErrorInfo{Type: "unknown_error", Message: fmt.Sprintf("tool %s: %s", c.Name, TenantMessage(err)), RetryStatus: "exhausted"}),
				r.idle(StopReason{Type: "end_turn"}))
			return r.commit(ctx, sessionID, s, Commit{Consume: a.Consume, Events: evs, Status: "idle"})
		}
		evs = append(evs, r.out(AgentToolResult, map[string]any{"tool_use_id": c.EventID, "content": storableBlocks(res.Content), "is_error": res.IsError}))
	}
	return r.commit(ctx, sessionID, s, Commit{Consume: a.Consume, Events: evs, Status: "running"})
}

// runTool runs one built-in tool call, trying again after a transient
// error (kind unavailable) up to ToolRetries times with exponential
// backoff. Other errors, and the last transient one, are returned (the
// latter saying how many tries it took); so is ctx's end.
func (r *Loop) runTool(ctx context.Context, sessionID string, c ToolCall) (ToolResult, error) {
	retries := r.ToolRetries
	switch {
	case retries == 0:
		retries = 4
	case retries < 0:
		retries = 0
	}
	for attempt := 0; ; attempt++ {
		res, err := r.Tools.Run(ctx, sessionID, c)
		if err == nil || ctx.Err() != nil || errdefs.KindOf(err) != errdefs.UnavailableKind {
			return res, err
		}
		if attempt >= retries {
			if attempt > 0 {
				err = &triedErr{err: err, tries: attempt + 1}
			}
			return res, err
		}
		wait := toolBackoff(attempt + 1)
		if r.ToolBackoff != nil {
			wait = r.ToolBackoff(attempt + 1)
		}
		select {
		case <-ctx.Done():
			return ToolResult{}, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// triedErr is the last transient error of a tool call tried more than once.
type triedErr struct {
	err   error
	tries int
}

func (e *triedErr) Error() string { return fmt.Sprintf("%v (tried %d times)", e.err, e.tries) }
func (e *triedErr) Unwrap() error { return e.err }

// toolBackoff is the default wait before tool retry n: 100ms·2^(n-1), at
// most 2s.
func toolBackoff(n int) time.Duration {
	if n > 5 {
		return 2 * time.Second
	}
	return min(100*time.Millisecond<<(n-1), 2*time.Second)
}
