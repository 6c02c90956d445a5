// Package hostagent is the per-host agent, `corral host`: it registers with the
// control plane over hostagent.v1, reports health and capacity, and drives
// sandboxes through containerd with gVisor (runsc) for hardened isolation.
//
// Its subpackages: agent (the run loop: register, heartbeat, watch
// assignments, reconcile), sandbox (each sandbox's lifecycle) and driver (the
// small Driver interface, its containerd and process implementations and the
// conformance suite every implementation passes) and egress (the per-sandbox
// network and egress proxy, and the audit records heartbeats carry). The host agent never imports
// the control plane; the two meet only at the protocol.
package hostagent
