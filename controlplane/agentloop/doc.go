// Package agentloop runs a session's agent: it reads the session's event log,
// decides the next step, and carries it out through small ports (a model
// client, a tool runner, an event store, a preview sink). The log is the
// loop's only state, so a runner that stops anywhere (crash, redeploy,
// another node taking over) resumes by reading the log again.
//
// Decide is a pure function from the log to the next Action:
//
//	          user.message queued
//	idle ───────────────────────────▶ StartTurn (status_running, messages consumed)
//	 ▲                                     │
//	 │                                     ▼
//	 │ EndTurn(end_turn)  ◀── text only ── CallModel ◀──────────────┐
//	 │                                     │ tool uses              │
//	 │                                     ▼                        │
//	 │ Block(requires_action) ◀── custom tool / always_ask pending  │
//	 │    (idle until user.custom_tool_result / tool_confirmation)  │
//	 │                                     │ all resolvable         │
//	 │                                     ▼                        │
//	 │                          RunTools (run allowed, deny denied) ┘
//	 │
//	 └── user.interrupt at any step boundary: EndTurn(end_turn)
//
// An interrupt that arrives mid-step (a model call, a tool call that runs
// for minutes) ends the step's context with ErrInterrupted, so the turn
// ends at once; EndTurn then asks the Toolbox (ToolCanceler) to stop the
// turn's tool calls that have no result, which also reaches a command a
// runner on another node started. A loop stopped because its node stops
// ends with ErrHandOver instead: work running outside the process is left
// for the session's next runner.
//
// Loop applies actions: each step ends in one Commit that appends the
// step's events and changes the session's status in one transaction. A
// Run (one wake of the session) reads the log whole once; before each
// later step it reads only what was appended since (Store.LoadSince: its
// own last commit, a client's new input), and it marks the user events
// its commits consume in its copy, so a step costs the same in a session
// of a thousand events as in one of ten. Whatever could make the copy
// differ from the log (a failed commit, a changed agent snapshot) makes
// the next step read it whole again.
//
// What the model writes that clients see only in part is kept with its
// event (Event.Private, never served): thinking blocks behind agent.thinking,
// a server tool's use and result behind agent.tool_use and agent.tool_result
// (the provider ran it within the request, so Decide has nothing to run),
// and each request's stop reason on its span.model_request_end. Conversation
// puts the blocks back where they came. A response that stopped with
// pause_turn is continued (CallModel again, at most Config.MaxPauses times a
// turn). Before each model request the Loop's Limits may end the turn
// instead (a tenant's token quota, a session's budget: budget_reached), and
// its ModelPicker may choose the session's client (a tenant's own key).
//
// A built-in tool call that fails with a transient error (errdefs kind
// unavailable) is tried again within its step, with backoff, before the
// turn ends with a session.error: calls are safe to repeat.
//
// With a Tracer (OpenTelemetry's API only; the server owns the SDK), each
// step that acts is a span, a child of the span whose request woke the
// loop (Pool.WakeFrom keeps its span context for the next Run), so a turn
// is one trace from the client's request to the host's exec.
//
// In a self-hosted session (Agent.SelfHosted: its environment is
// self_hosted) the loop never runs a built-in tool call and never asks for
// a sandbox: an allowed call blocks the session (requires_action) like a
// custom tool, until the environment's worker, on the tenant's machine,
// answers it with a user.tool_result; a denied one is still answered here.
package agentloop
