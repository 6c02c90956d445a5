package agentloop

import (
	"fmt"

	"corral.dev/corral/controlplane/model"
)

// Action is the next step of a session, as Decide sees it.
type Action interface{ action() }

// Wait: nothing to do until a new event arrives.
type Wait struct{}

// ConsumeOnly marks user events processed and does nothing else (an
// interrupt while idle).
type ConsumeOnly struct{ Consume []string }

// StartTurn consumes the queued user messages and moves the session to
// running.
type StartTurn struct{ Consume []string }

// CallModel asks the model for the next response.
type CallModel struct {
	Request     model.Request
	Consume     []string // tool results and confirmations the call answers
	NeedRunning bool     // the session is idle (after requires_action) and must say it runs again
	Round       int      // 1 for the turn's first call
}

// RunTools runs (or denies) the built-in tool calls of the last response.
type RunTools struct {
	Calls       []ToolCall
	Consume     []string
	NeedRunning bool
}

// Block idles the session until the client answers the listed tool uses.
type Block struct{ EventIDs []string }

// EndTurn idles the session, optionally after reporting an error.
type EndTurn struct {
	Stop    StopReason
	Consume []string
	Error   *ErrorInfo
	// Abandon lists the built-in tool calls of an interrupted turn that
	// have no result: one may still be running (on this node's last step
	// or on a runner elsewhere) and is stopped.
	Abandon []ToolCall
}

// ToolCall is a built-in or MCP tool call to run, or to answer with a
// denial.
type ToolCall struct {
	EventID     string // the agent.tool_use or agent.mcp_tool_use event
	Name        string
	MCPServer   string // the MCP server's name, for an MCP tool
	Input       []byte
	Deny        bool
	DenyMessage string
}

// ErrorInfo is the error of a session.error event.
type ErrorInfo struct {
	Type          string // unknown_error, model_overloaded_error, ...
	Message       string
	MCPServerName string // for mcp_connection_failed_error and mcp_authentication_failed_error
	RetryStatus   string // retrying, exhausted, terminal
}

func (Wait) action()        {}
func (ConsumeOnly) action() {}
func (StartTurn) action()   {}
func (CallModel) action()   {}
func (RunTools) action()    {}
func (Block) action()       {}
func (EndTurn) action()     {}

// Config bounds a turn.
type Config struct {
	// MaxRounds caps model calls per turn. Default 20.
	MaxRounds int
	// MaxTokens per model call. Default 4096.
	MaxTokens int
	// Exec are the bash tool's limits the model is told (the session's
	// runtime profile). Zero: DefaultExecLimits.
	Exec ExecLimits
	// MaxPauses caps how often a turn continues after the model paused it
	// (stop reason pause_turn, after a long server tool turn). Default 5.
	MaxPauses int
	// Thinking, when set, enables the model's extended thinking in every
	// request (the operator's choice: the Managed Agents agent has no
	// field for it).
	Thinking *model.Thinking
}

func (c Config) withDefaults() Config {
	if c.MaxRounds == 0 {
		c.MaxRounds = 20
	}
	if c.MaxPauses == 0 {
		c.MaxPauses = 5
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 4096
	}
	return c
}

// Decide returns the session's next step. It is a pure function of the agent
// snapshot and the event log (oldest first).
func Decide(agent Agent, log []Event, cfg Config) (Action, error) {
	cfg = cfg.withDefaults()
	tools, err := resolveTools(agent, cfg.Exec)
	if err != nil {
		return nil, fmt.Errorf("agent tools: %w", err)
	}

	// The scans below cover the current turn, found from the end of the
	// log, except the one for queued user events, which may be older and
	// is a flag test per event: a long session costs little more to
	// decide than a short one. (Conversation, for a model call, reads the
	// whole log.)
	lastStatus := ""
	var lastIdle *StopReason // the stop reason of the last status, if idle
	turnStart := 0           // index of the first event of the current (or next) turn
	for i := len(log) - 1; i >= 0; i-- {
		e := &log[i]
		if e.Type != StatusRunning && e.Type != StatusIdle {
			continue
		}
		if lastStatus == "" {
			lastStatus = e.Type
			if e.Type == StatusIdle {
				lastIdle = e.StopReason
			}
		}
		if e.Type == StatusIdle && (e.StopReason == nil || e.StopReason.Type != "requires_action") {
			turnStart = i + 1
			break
		}
	}
	turnOpen := false
	for _, e := range log[turnStart:] {
		if e.Type == StatusRunning {
			turnOpen = true
			break
		}
	}

	var queuedMessages, interrupts, answers []string
	for i := range log {
		e := &log[i] // Event is large: the loops over the whole log do not copy it
		if e.Processed {
			continue
		}
		switch e.Type {
		case UserMessage:
			queuedMessages = append(queuedMessages, e.ID)
		case UserInterrupt:
			interrupts = append(interrupts, e.ID)
		case UserToolConfirmation, UserCustomToolResult, UserToolResult:
			if i >= turnStart {
				answers = append(answers, e.ID)
			}
		}
	}

	if len(interrupts) > 0 {
		if turnOpen {
			end := EndTurn{Stop: StopReason{Type: "end_turn"}, Consume: append(interrupts, answers...)}
			if !agent.SelfHosted {
				// A self-hosted worker sees the interrupt itself.
				end.Abandon = unanswered(log[turnStart:])
			}
			return end, nil
		}
		return ConsumeOnly{Consume: interrupts}, nil
	}
	if !turnOpen {
		if len(queuedMessages) > 0 {
			return StartTurn{Consume: queuedMessages}, nil
		}
		return Wait{}, nil
	}

	// The turn is open: look at the model's last response.
	turn := log[turnStart:]
	rounds, lastStart := 0, -1
	for i, e := range turn {
		if e.Type == SpanModelRequestStart {
			rounds++
			lastStart = i
		}
	}
	needRunning := lastStatus == StatusIdle
	call := func() (Action, error) {
		if rounds >= cfg.MaxRounds {
			return EndTurn{
				Stop:    StopReason{Type: "end_turn"},
				Consume: answers,
				Error:   &ErrorInfo{Type: "unknown_error", Message: fmt.Sprintf("the turn reached its limit of %d model requests", cfg.MaxRounds), RetryStatus: "exhausted"},
			}, nil
		}
		return CallModel{
			Request: model.Request{
				Model:     agent.Model.ID,
				System:    agent.systemPrompt(),
				Messages:  Conversation(log),
				Tools:     tools.forModel,
				MaxTokens: cfg.MaxTokens,
				Thinking:  cfg.Thinking,
			},
			Consume:     answers,
			NeedRunning: needRunning,
			Round:       rounds + 1,
		}, nil
	}
	if lastStart < 0 {
		return call()
	}
	// A model request whose end was never written was cut short (its
	// runner stopped or was replaced mid-call): make it again.
	ended := false
	for _, e := range turn[lastStart:] {
		ended = ended || e.Type == SpanModelRequestEnd
	}
	if !ended {
		return call()
	}

	// A result or confirmation follows the tool use it answers.
	results := map[string]bool{}
	confirmations := map[string]Event{}
	paused := false
	for _, e := range turn[lastStart:] {
		switch e.Type {
		case SpanModelRequestEnd:
			paused = e.Private != nil && e.Private.StopReason == "pause_turn"
		case AgentToolResult, UserToolResult:
			results[e.ToolUseID] = true
		case AgentMCPToolResult:
			results[e.MCPToolUseID] = true
		case UserCustomToolResult:
			results[e.CustomToolUseID] = true
		case UserToolConfirmation:
			confirmations[e.ToolUseID] = e
		}
	}
	var uses, needAction []string
	var toRun []ToolCall
	for _, e := range turn[lastStart:] {
		switch e.Type {
		case AgentToolUse, AgentCustomToolUse, AgentMCPToolUse:
		default:
			continue
		}
		if e.serverTool() {
			continue // the provider ran it, within the model request
		}
		uses = append(uses, e.ID)
		if results[e.ID] {
			continue
		}
		if e.Type == AgentCustomToolUse {
			needAction = append(needAction, e.ID) // custom tools wait for the client
			continue
		}
		tc := ToolCall{EventID: e.ID, Name: e.Name, Input: e.Input, MCPServer: e.MCPServerName}
		switch e.EvaluatedPermission {
		case "ask":
			c, ok := confirmations[e.ID]
			if !ok {
				needAction = append(needAction, e.ID)
				continue
			}
			if c.Result != "allow" {
				tc.Deny, tc.DenyMessage = true, denyMessage(c.DenyMessage, "the user denied this tool call")
			}
		case "deny":
			tc.Deny, tc.DenyMessage = true, fmt.Sprintf("tool %q is not available to this agent", e.Name)
		}
		if agent.SelfHosted && e.Type == AgentToolUse && !tc.Deny {
			needAction = append(needAction, e.ID) // the environment's worker runs it
			continue
		}
		toRun = append(toRun, tc)
	}
	if len(needAction) > 0 {
		if lastStatus == StatusIdle && lastIdle != nil && lastIdle.Type == "requires_action" {
			return Wait{}, nil
		}
		return Block{EventIDs: needAction}, nil
	}
	if len(toRun) > 0 {
		return RunTools{Calls: toRun, Consume: answers, NeedRunning: needRunning}, nil
	}
	if paused && len(uses) == 0 {
		// The provider paused a long server tool turn: the conversation,
		// the paused response in it, goes back to let the model go on.
		pauses := 0
		for _, e := range turn {
			if e.Type == SpanModelRequestEnd && e.Private != nil && e.Private.StopReason == "pause_turn" {
				pauses++
			}
		}
		if pauses > cfg.MaxPauses {
			return EndTurn{
				Stop:    StopReason{Type: "end_turn"},
				Consume: answers,
				Error:   &ErrorInfo{Type: "unknown_error", Message: fmt.Sprintf("the model paused the turn %d times, past the limit of %d continuations; send a message to go on", pauses, cfg.MaxPauses), RetryStatus: "exhausted"},
			}, nil
		}
		return call()
	}
	if len(uses) == 0 {
		return EndTurn{Stop: StopReason{Type: "end_turn"}, Consume: answers}, nil
	}
	return call()
}

// unanswered returns the built-in tool uses of turn without a result.
func unanswered(turn []Event) []ToolCall {
	answered := map[string]bool{}
	for _, e := range turn {
		if e.Type == AgentToolResult || e.Type == UserToolResult {
			answered[e.ToolUseID] = true
		}
	}
	var out []ToolCall
	for _, e := range turn {
		if e.Type == AgentToolUse && !answered[e.ID] && e.EvaluatedPermission != "deny" && !e.serverTool() {
			out = append(out, ToolCall{EventID: e.ID, Name: e.Name, Input: e.Input})
		}
	}
	return out
}

func denyMessage(msg, def string) string {
	if msg == "" {
		return def
	}
	return msg
}

// Conversation rebuilds the model conversation from the log: processed user
// messages, the agent's messages, thinking and tool uses, and tool results;
// a server tool's use and result, and thinking, as the model wrote them
// (Event.Private), in the assistant's message where they came. A tool use
// that never got a result (its turn was interrupted) is answered with an
// error result, so the conversation stays well formed.
func Conversation(log []Event) []model.Message {
	// Every message's blocks go into one array, each message a span of it:
	// a few allocations for the whole log rather than a few per event.
	type span struct {
		role  string
		start int
	}
	n := 0
	for i := range log {
		switch e := &log[i]; e.Type {
		case UserMessage, AgentMessage:
			n += len(e.Content)
		case AgentThinking:
			n++
		case AgentToolUse, AgentCustomToolUse, AgentMCPToolUse:
			n += 2 // the use, and its result or the made-up one
		}
	}
	blocks := make([]model.Block, 0, n)
	var spans []span
	add := func(role string, b model.Block) {
		if n := len(spans); n == 0 || spans[n-1].role != role {
			spans = append(spans, span{role: role, start: len(blocks)})
		}
		blocks = append(blocks, b)
	}
	var open []string // tool uses of the current assistant message without results
	answered := map[string]bool{}
	closeOpen := func() {
		for _, id := range open {
			if !answered[id] {
				add("user", model.Block{Type: "tool_result", ToolUseID: id, IsError: true,
					Content: textBlocks("the tool call was not completed: the turn ended first")})
				answered[id] = true
			}
		}
		open = open[:0]
	}
	for i := range log {
		switch e := &log[i]; e.Type {
		case UserMessage:
			if !e.Processed {
				continue
			}
			closeOpen()
			for _, b := range e.Content {
				switch b.Type {
				case "text":
					add("user", model.Block{Type: "text", Text: b.Text})
				case "image", "document":
					add("user", model.Block{Type: b.Type, Source: b.Source, Title: b.Title, Context: b.Context})
				}
			}
		case AgentMessage:
			if len(open) > 0 {
				closeOpen()
			}
			for _, b := range e.Content {
				if b.Type == "text" {
					add("assistant", model.Block{Type: "text", Text: b.Text})
				}
			}
		case AgentThinking:
			if len(open) > 0 {
				closeOpen()
			}
			if e.Private != nil {
				for _, b := range e.Private.Blocks {
					add("assistant", b)
				}
			}
		case AgentToolUse, AgentCustomToolUse, AgentMCPToolUse:
			if e.serverTool() {
				// The provider's own block, in its place in the
				// assistant's message; its result follows it there.
				add("assistant", e.Private.Blocks[0])
				continue
			}
			add("assistant", model.Block{Type: "tool_use", ID: e.ID, Name: e.Name, Input: e.Input})
			open = append(open, e.ID)
		case AgentToolResult, AgentMCPToolResult, UserCustomToolResult, UserToolResult:
			if e.serverTool() {
				add("assistant", e.Private.Blocks[0])
				continue
			}
			id := e.ToolUseID
			switch e.Type {
			case UserCustomToolResult:
				id = e.CustomToolUseID
			case AgentMCPToolResult:
				id = e.MCPToolUseID
			}
			if answered[id] {
				continue
			}
			answered[id] = true
			add("user", model.Block{Type: "tool_result", ToolUseID: id, Content: e.Content, IsError: e.IsError})
		}
	}
	if len(spans) == 0 {
		return nil
	}
	msgs := make([]model.Message, len(spans))
	for i, sp := range spans {
		end := len(blocks)
		if i+1 < len(spans) {
			end = spans[i+1].start
		}
		msgs[i] = model.Message{Role: sp.role, Content: blocks[sp.start:end:end]}
	}
	return msgs
}
