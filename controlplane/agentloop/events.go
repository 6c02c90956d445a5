package agentloop

import (
	"encoding/json"

	"corral.dev/corral/controlplane/model"
)

// Event is the loop's view of one logged event: the wire fields it reads.
type Event struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Seq       int64  `json:"-"` // the event's place in the session's log, from 1
	Processed bool   `json:"-"` // user events: consumed by the loop

	Content []model.Block `json:"content,omitempty"`
	// Tool uses.
	Name                string          `json:"name,omitempty"`
	Input               json.RawMessage `json:"input,omitempty"`
	EvaluatedPermission string          `json:"evaluated_permission,omitempty"`
	MCPServerName       string          `json:"mcp_server_name,omitempty"`
	// Results and confirmations.
	ToolUseID       string `json:"tool_use_id,omitempty"`
	CustomToolUseID string `json:"custom_tool_use_id,omitempty"`
	MCPToolUseID    string `json:"mcp_tool_use_id,omitempty"`
	Result          string `json:"result,omitempty"`
	DenyMessage     string `json:"deny_message,omitempty"`
	IsError         bool   `json:"is_error,omitempty"`
	// Status events.
	StopReason *StopReason `json:"stop_reason,omitempty"`
	// session.error: the error object as written.
	Error json.RawMessage `json:"error,omitempty"`

	// Private is what the event keeps for the loop alone (nil: nothing).
	Private *Private `json:"-"`
}

// Private is what an event keeps for the loop alone: stored with the
// event, never served to clients. The Managed Agents API shows thinking
// only as agent.thinking, a sign of progress, and a server tool's call as
// agent.tool_use and agent.tool_result; the model, though, must get the
// blocks back as it wrote them (signatures, encrypted results) to go on.
type Private struct {
	// Blocks are the model's blocks the event stands for, as the model
	// client returned them: thinking or redacted_thinking (agent.thinking),
	// server_tool_use (agent.tool_use of a server tool), a server tool's
	// result (its agent.tool_result).
	Blocks []model.Block `json:"blocks,omitempty"`
	// StopReason is the model's stop reason, on span.model_request_end:
	// pause_turn continues the turn.
	StopReason string `json:"stop_reason,omitempty"`
	// Model is the model asked, on span.model_request_end: its tokens
	// are metered by model (the store's usage report).
	Model string `json:"model,omitempty"`
}

// serverTool reports whether e is the use or the result of a server tool:
// the model's provider ran it, within the model request.
func (e *Event) serverTool() bool {
	return e.Private != nil && len(e.Private.Blocks) == 1 && e.Private.Blocks[0].Server()
}

// StopReason says why a session went idle.
type StopReason struct {
	Type     string   `json:"type"` // end_turn, requires_action, retries_exhausted, refusal, budget_reached
	EventIDs []string `json:"event_ids,omitempty"`
}

// Event types the loop reads or writes.
const (
	UserMessage          = "user.message"
	UserInterrupt        = "user.interrupt"
	UserToolConfirmation = "user.tool_confirmation"
	UserCustomToolResult = "user.custom_tool_result"
	// UserToolResult answers a built-in tool call of a self-hosted session
	// (its worker ran it).
	UserToolResult = "user.tool_result"

	AgentMessage       = "agent.message"
	AgentThinking      = "agent.thinking"
	AgentToolUse       = "agent.tool_use"
	AgentToolResult    = "agent.tool_result"
	AgentCustomToolUse = "agent.custom_tool_use"
	AgentMCPToolUse    = "agent.mcp_tool_use"
	AgentMCPToolResult = "agent.mcp_tool_result"

	// SessionUpdated is logged with every change of the session's agent
	// snapshot (and of its title or metadata).
	SessionUpdated = "session.updated"

	StatusRunning = "session.status_running"
	StatusIdle    = "session.status_idle"
	SessionError  = "session.error"

	SpanModelRequestStart = "span.model_request_start"
	SpanModelRequestEnd   = "span.model_request_end"
)

// Out is an event the loop emits. Fields holds everything but id and type,
// ready to be marshalled into the event's JSON.
type Out struct {
	ID     string
	Type   string
	Fields map[string]any
	// Private is stored with the event and never served (nil: nothing).
	Private *Private
}

// MarshalJSON writes the event as it appears on the wire (without
// processed_at, which the store adds).
func (o Out) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(o.Fields)+2)
	for k, v := range o.Fields {
		m[k] = v
	}
	m["id"] = o.ID
	m["type"] = o.Type
	return json.Marshal(m)
}

func textBlocks(text string) []model.Block {
	return []model.Block{{Type: "text", Text: text}}
}

// jsonRaw keeps a model's tool input as the JSON it was.
type jsonRaw json.RawMessage

// MarshalJSON implements json.Marshaler.
func (j jsonRaw) MarshalJSON() ([]byte, error) {
	if len(j) == 0 {
		return []byte("{}"), nil
	}
	return j, nil
}
