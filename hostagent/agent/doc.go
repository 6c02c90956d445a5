// Package agent is the host agent's run loop, the library behind
// `corral host`:
//
//	start: lock the state dir (one agent per host)
//	       load host certificate, or Join with the one-time token
//	       driver's own cleanup of half-made sandboxes, where it has one
//	       load sandbox records, Attach to each (driver.Ref from the state dir)
//	       serve SandboxService (mutual TLS) on its own listener
//	loop:  dial the control plane ── Connect ── Register
//	         ◀── Registered (placed keys): remove sandboxes no longer placed
//	         ◀── Assignment ensure/destroy ── reconcile via the Driver ── result ──▶
//	         tick: pressure? evict idle sandboxes (workspace kept) ── Heartbeat ──▶
//	       on a broken stream: back off, dial again
//
// State dir: pki/ (CA, host certificate and key, 0600), sandboxes/ (one
// JSON record per sandbox, written atomically), evicted/ (kept workspaces),
// lock.
//
// Local enforcement: an ensure beyond the allocatable capacity is refused
// with an error of kind resource exhausted, sent back as the assignment's
// result. Under memory or disk pressure the agent evicts idle sandboxes, the
// least recently used first, keeping each workspace in its state dir until
// the sandbox is ensured again, and reports the evictions in the next
// heartbeat.
package agent
