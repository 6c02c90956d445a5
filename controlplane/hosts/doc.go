// Package hosts is the control plane's side of hostagent.v1's HostService,
// over the Raft FSM (controlplane/raftfsm): host joining, the hosts'
// streams, heartbeats, assignments, readiness and host loss. Everything
// about a session's sandbox past its placement (tool calls, moves,
// release) is controlplane/fleet's; this package gives the fleet the
// credentials to reach hosts (SandboxCredentials).
//
// # Who does what
//
//	Join (any node)          consume the token through Raft, sign the CSR with the replicated CA
//	Connect (leader only)    a follower answers Unavailable and names the leader's address in
//	                         the "corral-leader" trailer; the agent goes there
//	  Register               RegisterHost through Raft, its capacity the host's allocatable
//	                         resources times Config.Overcommit (applied here only); Registered
//	                         lists the FSM's placed keys and that capacity (schedulable), which
//	                         the host's own admission check uses
//	  Heartbeat              leader memory only: last seen, the sandboxes the host reports,
//	                         its conditions and providers' health; health that changed
//	                         (ok or reason) is written through Raft (SetHostHealth, health.go),
//	                         so every replica's scheduler filters on it; its egress audit
//	                         records of sessions placed on the host (or within EgressGrace
//	                         of their release) go to Config.OnEgress under the placement's
//	                         tenant, the rest are rejected and counted (egress.go); once
//	                         OnEgress has stored them a HeartbeatAck names the heartbeat,
//	                         and the host forgets them
//	  assignments            for a connected host: ensure what is placed there and missing
//	                         (with its limits, for its cgroup, its request and its egress
//	                         allowlist),
//	                         destroy what is there and no longer placed; recomputed on every
//	                         heartbeat, every result and every placement change on the host
//	                         (raftfsm's WatchPlacements)
//	  readiness              a placement whose sandbox the host reports READY (and has no
//	                         assignment in flight) is marked ready through Raft, and unmarked
//	                         when the host stops reporting it: the fleet's waiters on every
//	                         node watch their FSM for it, so nobody probes hosts
//	  pauses under pressure  a sandbox the host paused by itself under memory pressure (its
//	                         heartbeat's pressure_pauses) is recorded paused through Raft
//	                         (SetPaused, as the fleet's idle pause): the next tool call resumes
//	                         it through the FSM (paused.go)
//	timer (leader only)      a host not heard from for HostTTL is marked down through Raft
//	                         (with a heartbeat condition saying since when),
//	                         except within LeaderGrace of this node becoming leader; for each
//	                         down host that still holds placements OnHostDown is called (the
//	                         fleet moves them)
//	Register, Cordon,        the admin API's changes to host records, through Raft
//	Uncordon (any node)
package hosts
