// Package raftfsm is the control plane's replicated state machine: hosts,
// sandbox placements, tenant usage (derived from placements), tenant quotas,
// session-runner assignments and cluster members' HTTP addresses, kept by
// hashicorp/raft over raft-boltdb storage and a mutual-TLS transport.
//
// Versions: hashicorp/raft v1.7.3, not v1.8.0. raft v1.8.0 requires
// go-metrics v0.7.0, which no longer has the go-metrics/compat package that
// raft-boltdb/v2 v2.3.1 imports, so the two do not build together.
//
// # Command path
//
// Every write is a typed Command {type, idempotency_key, payload} applied
// through FSM.Apply, which dispatches on the type through one table:
//
//	caller ──► Node.Apply(ctx, cmd)
//	             │ this node leads? ──no──► POST leader /v1/raft/apply ──► leader's Node.applyLocal
//	             │ yes                         (503 + leader hint: retry, polling with ctx deadline)
//	             ▼
//	           raft.Apply ──► log replicated to a quorum ──► FSM.Apply on every replica
//	                                                          │ key seen? ─yes─► recorded Result
//	                                                          ▼
//	                                                        handlers[cmd.Type](state, payload)
//	                                                          │ place: scheduler.Admit (Validate
//	                                                          │ + quota), deterministic
//	                                                          ▼
//	                                                        Result recorded under the key
//	                                                        (bounded FIFO, in snapshots)
//
// Forwarding: a write sent to a follower is forwarded by the follower itself
// over a small HTTP endpoint every node serves (Config.HTTPAddr); members'
// HTTP addresses are replicated state (the member command). When no leader is
// known, Node.Apply polls until one is or its context ends. A command whose
// outcome is unknown (leadership lost mid-apply) is retried with the same
// idempotency key, so it takes effect once.
//
// # Reads
//
// Node.Read runs against this node's local FSM: it may lag the leader by the
// replication delay (on a healthy loopback cluster, milliseconds; on a
// partitioned follower, unboundedly). Node.ReadConsistent is linearizable:
// it runs on the leader after a raft Barrier (a quorum round trip that also
// waits for the FSM to apply everything committed before it), and returns
// errdefs.Unavailable naming the leader on a follower.
//
// # The host protocol's state
//
// fleet.go adds what controlplane/hosts needs: the hosts' CA (certificate and
// key, the first one committed wins, so every node signs with the same),
// one-time join tokens (only the SHA-256 of the secret; consuming one is a
// command, so a token works once across the cluster; expiry is checked
// against the proposer's clock carried in the payload), the host ids that
// joined, each node's HostService address, and move_placement, which moves
// a session's placement to another host in one step (re-checked with
// scheduler.Admit with the old placement taken away, so quotas do not count
// it twice). WatchPlacements tells controlplane/hosts which host's
// placements changed, so the leader pushes assignments at once.
//
// health.go adds set_host_health: a host's conditions (pressure,
// containerd, heartbeat) and its providers' canary outcomes, which the
// scheduler's filters read. The leader proposes it only when what a host
// reports changed, never once per heartbeat; a host that registers again
// keeps its conditions, except the heartbeat's.
//
// # Node trust and sealed secrets
//
// Nodes authenticate each other (tls.go, nodejoin.go, trust.go). The Raft
// transport is hashicorp/raft's NetworkTransport over a TLS stream layer,
// and the forwarding endpoint is HTTPS; both require a node certificate of
// the cluster's nodes' CA (hostpki: URI SAN corral://node/<id>), so a peer
// without one fails the handshake before Raft or HTTP decodes a byte. A
// bootstrap node makes the nodes' CA and its certificate and commits the CA
// (set_node_ca); a new node asks for the join server name, the one handshake
// without a client certificate, which reaches only POST /v1/node/join: it
// trades a one-time node token (add_node_token, consume_node_token: once,
// unexpired, never for a member's id) and a CSR for its certificate. Its
// token pins the CA, so the newcomer verifies the member it talks to.
//
// Private keys never enter a command in the clear: the hosts' and the nodes'
// CA keys are sealed (internal/seal, AES-256-GCM with a key id) with the
// node's seal keyring, and so is each node's own key in DataDir/node.
// reseal replaces them by the same keys sealed under the keyring's current
// key (Node.RotateSeal). Membership changes, token issues and rotations are
// audit-logged with the caller's verified node id.
//
// # Placements
//
// Node.Place plans with the pure scheduler over a stale local read, then
// commits the plan through Raft; Apply re-checks it with scheduler.Admit. A
// plan that went stale (concurrent placements filled its host) is planned
// again inside Apply, from the request and scheduler config the command
// carries, so every replica reaches the same plan and the caller saves a
// round trip; a command without them fails with errdefs.Conflict, and Place
// plans again.
//
// The leader batches placements (batch.go): the place commands that reach
// it while earlier ones commit go together in one place_batch entry, up
// to Config.PlaceBatch, with at most four batches committing at once. An
// idle leader commits a command alone, as it came, so batching adds no
// wait at low load. Each item keeps its idempotency key and gets its own
// result: it is admitted, or planned again, on the state the items before
// it left, and one that fails fails alone. The place command stays, for
// lone placements and the entries already in logs.
//
//	callers ──► leader: placeBatcher (4 workers; each takes what is queued, ≤ PlaceBatch)
//	              │ one command: place           │ more: place_batch{items: [{key, payload}…]}
//	              ▼                              ▼
//	            raft.Apply ──► FSM.Apply ──► per item: key seen? → Admit or re-plan → Result
//
// The FSM keeps the scheduler's index of its hosts (scheduler.Index, by
// pool, provider and zone): every command that changes a host re-files
// it, and a restore rebuilds it, so Place over a View looks only at the
// request's candidates.
package raftfsm
