// Package hosts is the control plane's side of hostagent.v1, over the Raft
// FSM (controlplane/raftfsm): host joining, the hosts' streams, heartbeats,
// assignments, host loss and drain.
//
// # Who does what
//
//	Join (any node)          consume the token through Raft, sign the CSR with the replicated CA
//	Connect (leader only)    a follower answers Unavailable and names the leader's address in
//	                         the "corral-leader" trailer; the agent goes there
//	  Register               RegisterHost through Raft; Registered lists the FSM's placed keys
//	  Heartbeat              leader memory only: last seen, the sandboxes the host reports
//	  assignments            for a connected host: ensure what is placed there and missing,
//	                         destroy what is there and no longer placed; recomputed on every
//	                         heartbeat, every result and every placement change on the host
//	                         (raftfsm's WatchPlacements)
//	timer (leader only)      a host not heard from for HostTTL is marked down through Raft,
//	                         except within LeaderGrace of this node becoming leader; each
//	                         placement on a down host moves to another host (one
//	                         move_placement command) and OnRescheduled is called
//	Drain (any node)         cordon and mark draining through Raft; per sandbox, under its
//	                         session lock: export the workspace from the old host into the
//	                         blob store, move the placement, wait for the new sandbox, import
//	                         the workspace there; at the deadline evict what is left
//	Sandbox (any node)       a SandboxService client for a host, over mutual TLS with this
//	                         node's control-plane certificate, cached per host
//
// # Session locks
//
// LockSandbox is a per-session lock. The tool path holds it around each
// tool call and Drain holds it while it moves the sandbox, so a sandbox
// moves between tool calls. Tool calls run on the session's runner node
// while a drain may run on any node, so the server sets Config.Locker to a
// cluster-wide lock (a PostgreSQL advisory lock); without one the lock only
// excludes callers in the same process.
package hosts
