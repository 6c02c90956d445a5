// Package tools runs the built-in toolset agent_toolset_20260401 (bash, read,
// write, edit, glob, grep) against a session's sandbox, as the agent loop's
// Toolbox. It holds no host protocol client: the Sandbox port is served by
// controlplane/fleet.
//
// A tool call goes
//
//	agentloop.Loop ──ToolCall──▶ Toolset.Run ──decode (strict, per schema)──▶ tool
//	                                   │                                         │
//	                                   └── SandboxFor(session) ──▶ Sandbox ◀─────┘
//	                                             (fleet: the session's sandbox on its host)
//
// Every tool works through the small Sandbox interface: Exec for bash, and
// the file calls (confined to the workspace by the host) for the rest, so
// read, write, edit, glob and grep behave the same in every image. Paths the
// model gives are absolute under /workspace or relative to it; anything else
// is refused before the sandbox is asked.
//
// bash runs each command in a fresh shell that starts in the directory where
// the previous command of the session ended: the command's shell prints its
// final directory after a per-call marker on stdout when it exits, and the
// toolset keeps it per session (in memory: a node that restarts, or another
// node taking the session over, starts the next command in the workspace
// again).
//
// Each bash command carries an execution id, the session and its
// agent.tool_use event (ExecutionID), which the host agent honours: the
// command runs once, outlives a caller that vanishes, and the session's
// next runner (another node, after a failover) that makes the same call
// attaches to it (or reads its stored result) instead of running it again.
// Its directory marker derives from that id, so the new runner reads the
// final directory too. When the loop's context ends the command is killed
// (CancelExec), unless the cause is agentloop.ErrHandOver. write and edit
// carry no id: a repeated write writes the same bytes; a repeated edit that
// already applied finds old_string gone and says so (an is_error result).
//
// A call whose input does not match the tool's schema, a path outside the
// workspace, a missing file or an ambiguous edit is a tool result with
// is_error set, which the model can act on; an unreachable sandbox is an
// error, which the loop reports as session.error.
package tools
