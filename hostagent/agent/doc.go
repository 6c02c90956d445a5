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
//	         tick: memory pressure? pause idle sandboxes, then evict; disk
//	               pressure? evict (workspace kept) ── Heartbeat ──▶
//	       refused by a follower: dial the leader it names, at once
//	       on a broken stream: back off, dial again
//	canary: each provider's (providers.go) once before the first Register,
//	       then every CanaryInterval, beside the loop; a change of health
//	       is sent at once in a heartbeat of its own
//	reap:  at start and every ReapInterval, beside the loop: destroy (and
//	       log) sandboxes nothing claims, once ReapGrace old: no record and
//	       not placed here, or their state dir gone; never a live host's
//
// State dir: pki/ (CA, host certificate and key, 0600), sandboxes/ (one
// JSON record per sandbox, written atomically), evicted/ (kept workspaces),
// executions/ (per sandbox: one JSON file per finished execution, one
// .started marker per running one), lock.
//
// Session mounts (session.go): SyncUploads and StageUpload put a
// session's files into its sandbox's uploads (root's, 0444, renamed into
// place from a staging directory beside them, listed in a manifest so a
// later sync removes exactly what is no longer wanted); ExportOutputs
// streams the regular files of its outputs, through an os.Root, links
// never followed, bounded in files, bytes, depth and names.
//
// Executions: an Exec with an execution id runs detached from its caller
// (to its end, its timeout, CancelExec, the sandbox's destruction or the
// agent's exit). Its output is buffered so that a repeated Exec with the id
// attaches to it from the start; once finished its result is kept (64 per
// sandbox, for an hour, also across an agent restart) and returned to a
// repeated Exec instead of running the command again. Each command runs at
// most once: its start is recorded on disk before it starts, and an
// execution found started but not finished after a restart (the agent was
// killed while it ran) is given the outcome "the host agent restarted while
// this command ran" (failed precondition), kept like any other, and never
// run again.
//
// Local enforcement: an ensure whose request (what its placement
// reserves; its limits for an ensure without one) does not fit beside the
// requests of the sandboxes already here is refused with an error of kind
// resource exhausted, sent back as the assignment's result. What they may
// add up to is what the control plane schedules against here
// (Registered.schedulable: the allocatable resources times its overcommit
// ratios), so the two checks agree; without it, the allocatable resources.
// Each sandbox's cgroup gets its whole limit.
//
// Providers (providers.go): the host offers sandbox providers (gvisor,
// runc, process; a registry by name, the place for later ones), each
// registered with its capabilities (isolation, platform, checkpoint,
// network modes, GPU) and reported in every heartbeat with its canary's
// last outcome. A provider failing its canary takes no new placements
// here; the control plane decides that, the agent only reports.
//
// Pressure (pressure.go): under memory pressure the agent pauses idle
// sandboxes where the driver can (runsc checkpoint), reporting each pause
// in the next heartbeat, and evicts only when none is left to pause; under
// disk pressure it evicts. Evicting keeps each workspace in its state dir
// until the sandbox is ensured again, and is reported in the next
// heartbeat. Both take idle sandboxes in one order: the tenant with the
// most running idle sandboxes on the host first, then (between tenants
// with as many) the one whose sandbox has been idle longest, and within a
// tenant the sandbox idle longest first.
//
// Live moves (migrate.go): on a pausable host (Register.pausable) a paused
// sandbox's checkpoint streams out (ExportCheckpoint), and a ready sandbox
// takes another host's checkpoint over its own init (RestoreCheckpoint),
// once its workspace holds the moved files.
//
// Image builds (build.go, images.go): BuildImage runs an environment's
// package steps as root in a gVisor build sandbox of the base image, in
// an egress network like a session's (the request's allowed hosts, its
// connections recorded under its audit id), and commits the root file
// system's changes as one layer: an image named ref, unpacked here, and
// reported in Register.images like any other. One build at a time (another
// is ResourceExhausted); an image already present is the cached result.
// ExportImage and ImportImage move such an image between hosts as an OCI
// layout tar, bounded by Config.MaxImageBytes. A build sandbox is never a
// session's: its id starts with driver.BuildIDPrefix, List never returns
// it, and after a crash the driver's Reconcile removes it and the agent its
// network.
//
// Traces (Config.Tracing): every SandboxService call is a server span that
// continues the trace context the control plane sent in its metadata
// (package tracing), so a tool call's trace reaches the command it ran.
package agent
