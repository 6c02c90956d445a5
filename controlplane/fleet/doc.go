// Package fleet owns a session's sandbox, from the first tool call to its
// release: admission, placement, readiness, the tool calls' way to the
// host, the session's mounts (mounts.go: its file resources staged into the
// sandbox before the tool calls that find them changed, its outputs
// published to the Files API at its idle), moves (drain, eviction), pauses (idle: pause.go; archived sessions,
// paused then released after their retention: archive.go), release, the
// deleted-session sweep, the tenant reaper, replacement notices and the
// tenants' sandbox quotas in Raft. It is the control plane's only client of the host agents'
// SandboxService; transports (api) and the agent loop (through tools) call
// it and never build its Raft commands themselves.
//
// # A tool call
//
//	tools.Toolset ── SandboxFor(session)
//	   fast path: one read of this node's FSM: placed, ready, not fenced
//	              ── the session's files staged (mounts.go)
//	              ──► sandbox on its host (cached connection) ──► Exec RPC
//	   slow path: the session's class (classes.go) ── admit (runtime
//	              rules) ── place (Raft; the FSM re-plans a
//	              stale plan) ── wait for ready (a watch over the FSM: the
//	              leader commits the host's AssignmentResult) ── notice
//	              if the sandbox replaced one lost with its host
//
// # Sandbox classes
//
// A session's sandbox is of a class (policy classes.yaml, through the
// Classes port): its runtime, provider, image, requests and limits. The
// class is admitted when the session is created (AdmitSession: unknown
// 400, not the tenant's 403, no host in its pools offers the provider
// 409) and kept on the session; its first placement, and every placement
// after an eviction, asks for the class's request. A move (drain, host
// loss) re-plans from the placement, which carries the provider, and the
// commit checks it again, so no move lands on a host without it.
//
// An Exec that meets a fence waits on the FSM until the mover is done and
// runs where the sandbox is then; one whose stream broke (the host agent
// restarted) re-attaches by its execution id, so the host reports each
// command's result once and never runs it twice. Reads, writes and
// listings are idempotent and retried alike.
//
// # Moves between calls: the fence
//
// No lock is taken on the tool path. A mover (Drain, Evict) fences the
// sandbox instead:
//
//	SetFence (Raft: tool calls on every node now wait)
//	  ── Fence RPC on the host (refuses new calls, waits for those in
//	     flight; answers Unavailable if they outlast the wait: try later)
//	  ── export the workspace ── MovePlacement carrying the fence
//	  ── wait for ready on the new host ── import ── LiftFence
//
// A fence lapses by itself (in Raft and on the host) at its deadline, so a
// mover that dies leaves nothing stuck.
//
// Between two pausable hosts a drain moves a gVisor sandbox live instead
// (live.go): the host pauses it, its checkpoint travels beside its
// workspace, and the new host's sandbox restores from it after the import,
// its processes running on; before the placement moved, any failure falls
// back to the workspace move. The lift records how it moved
// (Placement.Moved) and the session's next tool result says so.
package fleet
