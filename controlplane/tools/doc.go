// Package tools runs the built-in toolset agent_toolset_20260401 (bash, read,
// write, edit, glob, grep) against a session's sandbox, as the agent loop's
// ToolRunner.
//
// A tool call goes
//
//	agentloop.Runner ──ToolCall──▶ Runner.Run ──decode (strict, per schema)──▶ tool
//	                                   │                                        │
//	                                   └── SandboxFor(session) ──▶ Sandbox ◀────┘
//	                                                     (Remote: hostagent.v1 SandboxService)
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
// runner keeps it per session (in memory: a runner that restarts, or another
// node taking over, starts the next command in the workspace again).
//
// A call whose input does not match the tool's schema, a path outside the
// workspace, a missing file or an ambiguous edit is a tool result with
// is_error set, which the model can act on; an unreachable sandbox is an
// error, which the loop reports as session.error.
package tools
