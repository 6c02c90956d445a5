// Package spawn is the compiled spawner of a pausable gVisor sandbox
// (cmd/corral-spawn): the sandbox's init, the relay the driver execs for
// each command, and the start step between them. The containerd driver's
// spawn.go says why a pausable sandbox's commands run as children of its
// init; this package is how, without a shell.
//
//	driver ──runsc exec──▶ relay ──unix socket, fds──▶ init (pid 1)
//	   ▲ host stdio          │ pipes ◀─────────┐           │ fork+exec
//	   └──── copies ◀────────┘                  └── start ◀─┘ (rlimit, setsid, cd)
//	                                                  │ execve
//	                                                  ▼
//	                                               command
//
// The relay makes the command's pipes inside the sandbox, so no host
// descriptor of its own ever reaches the command (a process holding one
// that lives into a checkpoint breaks it): it sends their far ends to init
// over /tmp/.corral/spawn.sock with the command (Request), copies between
// them and its own standard streams, and exits with the status init writes
// back (Reply). Init starts this binary again as `start`, with the far ends
// as its standard streams and a session of its own; start lowers
// RLIMIT_NPROC, soft and hard, to the sandbox's limit (Go cannot between
// its fork and its exec), changes to the command's directory and execve's
// the command. Init reaps every child (orphans are reparented to it) and
// exits 0 on SIGTERM.
//
// Init, once restored from a checkpoint, may meet relays and a start step
// of another build (a live move to a host with a newer binary): the
// request and start's arguments carry a version, and what either side
// reads from the other is bounded and checked, refused when malformed.
package spawn
