// Package spawn is the compiled spawner of a pausable gVisor sandbox
// (cmd/corral-spawn): the sandbox's init, the relay the driver execs for
// each command, and a start step for a relay without init. The driver's
// spawn.go says why a pausable sandbox's commands run as children of its
// init; this package is how, without a shell.
//
//	driver ──runsc exec──▶ relay ──unix socket + fds──▶ init (pid 1)
//	   ▲ host stdio          │ pipes ◀──────────┐          │ fork (traced), execve:
//	   └──── copies ◀────────┘                   └─ command ◀┘ stopped at its exec,
//	                                                         RLIMIT_NPROC lowered, let go
//
// The relay makes the command's pipes inside the sandbox, so no host
// descriptor of its own ever reaches the command (a process holding one
// that lives into a checkpoint breaks it): it sends their far ends to init
// over /tmp/.corral/spawn.sock with the command (Request), copies between
// them and its own standard streams, and exits with the status init writes
// back (Reply). Init forks the command with the far ends as its standard
// streams, in a session of its own and its directory, with exactly its
// environment. Go cannot set an rlimit between its fork and its exec, so
// the fork asks to be traced (PTRACE_TRACEME): the command stops at its
// execve, before its first instruction, and init lowers its RLIMIT_NPROC,
// soft and hard, to the sandbox's limit (prlimit) before it lets it go
// (PTRACE_DETACH). The start mode does the same as a process of its own
// (the rlimit, then execve), for a relay that runs its command itself
// because init does not answer; as init's step it cost ~10 ms a command
// more under gVisor (a Go runtime's start). Init reaps every child
// (orphans are reparented to it) and exits 0 on SIGTERM.
//
// A sandbox mounts the build it was made with (the driver keeps a copy per
// build), but init, restored from a checkpoint on another host, may meet
// relays of another build (a live move between hosts of two versions): the
// request and start's arguments carry a version, and what either side
// reads from the other is bounded and checked, refused when malformed.
package spawn
