// Package runners decides which control-plane node runs each session's agent
// loop, and keeps that decision true as nodes come and go.
//
// The decision is replicated state: a runner assignment (session → node,
// epoch) in the Raft FSM, changed only by CmdAssignRunner, whose epoch grows
// on every change. A node runs a session's loop only while the FSM names it,
// and only after claiming the assignment's epoch in PostgreSQL; every event
// the loop appends carries that epoch and is refused, in the same
// transaction as the insert, once a newer epoch has been claimed. So a node
// that lost its assignment without knowing it (partitioned, paused, slow)
// cannot append anything after its successor has started.
//
//	input on node X ──► Manager.WakeForInput ──► assignment not X? ──► CAS assign → X (Raft)
//	                                                 │
//	Pool.Wake ──► Manager.Lock: FSM says X? ──no──► unassigned or its node gone? ─► CAS assign → X
//	                 │ yes                              else: not ours (ok=false)
//	                 ▼
//	             ClaimRunner(epoch) in PostgreSQL ──► loop runs with the epoch in its ctx
//	                                                  appends: epoch == sessions.runner_epoch?
//	                                                  no ─► agentloop.ErrNotRunner: loop stops
//
// The runner follows the input: a node that receives a session's input
// takes the session over (compare-and-set on the epoch it saw), so it never
// has to wake another node. The leader moves the sessions of nodes that left
// the configuration, or whose heartbeats have failed for longer than the
// grace period, to live nodes; every node resumes the loops newly assigned to
// it (Manager.Run).
package runners
