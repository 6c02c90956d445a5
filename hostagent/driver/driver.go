// Package driver is the contract between the host agent and whatever runs
// sandboxes: containerd with gVisor or runc, a folder on the host for
// development, a fake for unit tests. Every implementation passes the one
// conformance suite in drivertest.
//
// A sandbox is identified by its key (the session it serves): Create with the
// same key returns the same sandbox. Create returns a Ref, a small value the
// agent persists; after the agent restarts it calls Attach with the Ref and
// finds the sandbox, its workspace and its running processes as they were. A
// destroyed sandbox stays destroyed: Attach and every Sandbox method on it
// fail with an error of kind not found, never by making an empty replacement.
//
// A sandbox can be paused, where the driver supports it: Pause saves its
// processes and memory to the host's state dir and stops it, so it holds no
// CPU or memory; Resume brings it back with its processes as they were.
// While paused its workspace stays on disk (file methods work), Attach
// returns it without resuming it, and Exec resumes it first. A driver that
// cannot checkpoint answers Pause with an error of kind unimplemented.
//
// A driver may also build and move images (ImageBuilder, build.go): an
// environment's packages committed as a layer by a build sandbox, which is
// never one of its sandboxes (List does not return it).
//
// Paths given to file methods are relative to the workspace; ".." and symlinks
// that lead outside it are refused (kind invalid argument or permission
// denied).
package driver

import (
	"context"
	"io"
	"io/fs"
	"sync"
	"time"
)

// Spec describes the sandbox to create. Zero values mean the closed defaults:
// no network, no environment beyond PATH, the runtime profile's limits.
type Spec struct {
	// Key makes Create idempotent; one sandbox per key. Required.
	Key string
	// Image is the image reference (ignored by drivers without images).
	Image string
	// Limits bound the sandbox; zero fields take the driver's defaults.
	Limits Limits
	// Env is the complete environment of processes in the sandbox, already
	// filtered by the caller's allowlist. The host's environment is never
	// passed in.
	Env map[string]string
	// Labels are stored with the sandbox and returned by List.
	Labels map[string]string
	// NetworkNamespace, if set, is the path of the network namespace the
	// sandbox joins (the host's egress network, package egress) instead
	// of a fresh one with loopback only. A driver that cannot put a
	// sandbox in it refuses the spec (kind invalid argument).
	NetworkNamespace string
}

// Limits are resource bounds. Zero means the driver's default.
type Limits struct {
	CPUMillis   int64 // 1000 = one core
	MemoryBytes int64
	Pids        int64
	DiskBytes   int64 // workspace size, where the driver can enforce it
}

// Ref is a persisted reference to a sandbox: enough to Attach to it after the
// host agent restarts. Drivers may keep what they need in Data.
type Ref struct {
	Provider string            `json:"provider"`
	Key      string            `json:"key"`
	ID       string            `json:"id"`
	Data     map[string]string `json:"data,omitempty"`
	// Labels are the Spec's labels, as Create and List return them.
	Labels map[string]string `json:"labels,omitempty"`
	// Created is when the driver made the sandbox, by the host's clock.
	// List sets it (Create may not): the host agent judges by it how long
	// a sandbox nothing claims has been there.
	Created time.Time `json:"created,omitzero"`
	// Paused is set by List for a sandbox that is paused (checkpointed and
	// stopped).
	Paused bool `json:"paused,omitempty"`
}

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	// Command is argv; Command[0] is looked up on the sandbox's PATH.
	Command []string
	// Dir is the working directory relative to the workspace; "" is the
	// workspace itself.
	Dir string
	// Env is added to the sandbox's environment for this command.
	Env map[string]string
	// Stdin, if set, is copied to the command's standard input.
	Stdin io.Reader
	// Stdout and Stderr, if set, receive output as it is produced (streaming),
	// whatever the output limit.
	Stdout, Stderr io.Writer
	// Timeout kills the command after this long; the result then has exit
	// code 124 and keeps the output produced so far. Zero means the driver's
	// default.
	Timeout time.Duration
	// MaxOutput bounds the output kept in the result per stream, head and
	// tail; the middle is cut and Truncated set. Zero means the default.
	MaxOutput int
	// BeforeStart, if set, is called once, after the command is set up
	// and just before it starts; if it fails, the command never starts
	// and Exec returns its error. The host agent records there that an
	// execution started, overlapping the write with the setup.
	BeforeStart func() error
}

// OnceBeforeStart returns req.BeforeStart wrapped to run at most once
// (later calls return its first result), for drivers that may try to start
// a command more than once; without a hook, one that does nothing.
func OnceBeforeStart(req ExecRequest) func() error {
	if req.BeforeStart == nil {
		return func() error { return nil }
	}
	return sync.OnceValue(req.BeforeStart)
}

// ExecResult is the outcome of a command that ran. A command that could not
// be started is an error instead.
type ExecResult struct {
	ExitCode  int
	TimedOut  bool
	Stdout    []byte
	Stderr    []byte
	Truncated bool
	Duration  time.Duration
}

// FileInfo describes an entry in the workspace.
type FileInfo struct {
	Path    string // relative to the workspace
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
	// Changed is when the entry's content or status last changed (ctime):
	// the system sets it on every write, rename or chmod, and, unlike
	// ModTime, code in the sandbox cannot set it back (tar -x and cp -p
	// do). Incremental workspace snapshots compare it.
	Changed time.Time
}

// Driver creates and finds sandboxes.
type Driver interface {
	// Name is the stable provider name stored in every Ref ("containerd-gvisor",
	// "containerd-runc", "process", "fake").
	Name() string
	// Create makes the sandbox for spec.Key, or returns the existing one.
	Create(ctx context.Context, spec Spec) (Ref, error)
	// Attach returns the live sandbox behind ref. A destroyed or unknown
	// sandbox is an error of kind not found.
	Attach(ctx context.Context, ref Ref) (Sandbox, error)
	// Destroy removes the sandbox and its workspace. Destroying what is
	// already gone succeeds.
	Destroy(ctx context.Context, ref Ref) error
	// List returns every sandbox this driver manages on the host, with
	// their creation times, for reconciliation after a restart and for
	// reaping what nothing claims.
	List(ctx context.Context) ([]Ref, error)
	// Pause checkpoints the sandbox and stops it, keeping its workspace;
	// pausing a paused sandbox succeeds. Kind unimplemented where the
	// driver cannot checkpoint; kind not found for a destroyed sandbox.
	Pause(ctx context.Context, ref Ref) error
	// Resume restores a paused sandbox, its processes as they were, and
	// removes its checkpoint; resuming a running sandbox succeeds.
	Resume(ctx context.Context, ref Ref) error
}

// DiskMeter is implemented by drivers that can say how much of the host's
// disk a sandbox holds: its disk image's allocated blocks, its checkpoint
// image, its root file system's writes. A paused sandbox cannot grow, so
// that is all the disk it reserves until it resumes.
type DiskMeter interface {
	DiskUsed(ctx context.Context, ref Ref) (int64, error)
}

// Sandbox is a live sandbox.
type Sandbox interface {
	Ref() Ref
	// Exec runs a command to completion (or timeout, or ctx cancellation,
	// which kills it and returns ctx's error).
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// ReadFile returns a workspace file's contents, at most max bytes
	// (zero: DefaultMaxReadBytes). A larger file is refused with kind too
	// large, from its size, before it is read; anything but a regular file
	// is refused with kind invalid argument.
	ReadFile(ctx context.Context, path string, max int64) ([]byte, error)
	// OpenFile opens a workspace regular file to be read as a stream, and
	// returns its size then: for what copies files whole (a workspace's
	// export), which must not hold them in memory.
	OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error)
	// WriteFile creates or replaces a workspace file, creating parent
	// directories.
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	// CreateFile creates or replaces a workspace file to be written as a
	// stream, creating parent directories: for what copies files whole
	// (a workspace's import), which must not hold them in memory.
	CreateFile(ctx context.Context, path string, mode fs.FileMode) (io.WriteCloser, error)
	// ListFiles lists the entries of a workspace directory.
	ListFiles(ctx context.Context, dir string) ([]FileInfo, error)
}

// SessionDirs is implemented by the sandboxes that show a session's
// mounts: the host agent stages the session's files into Uploads and
// collects what the sandbox wrote into Outputs, from the host side, never
// by entering the sandbox. A sandbox without it takes neither (the agent
// answers unimplemented).
type SessionDirs interface {
	// SessionDirs returns the sandbox's host directories.
	SessionDirs() Dirs
}

// Where a sandbox shows its session mounts (Dirs), as the control plane's
// tools name them.
const (
	UploadsMount = "/mnt/session/uploads"
	OutputsMount = "/mnt/session/outputs"
	MemoryMount  = "/mnt/memory"
)

// Dirs are the host directories behind a sandbox's session mounts.
type Dirs struct {
	// Uploads is shown read-only at /mnt/session/uploads: the sandbox's
	// user cannot create, change or remove anything in it.
	Uploads string
	// Outputs is shown writable at /mnt/session/outputs.
	Outputs string
	// Memory is shown at /mnt/memory: the session's memory stores, one
	// directory each, staged as the uploads are. The directory and those
	// of read_only stores are root's (0755, files 0444): the sandbox's
	// user cannot change them; a read_write store's directory is
	// Writer's. "" for a sandbox without it.
	Memory string
	// MemoryStaging is the staging directory of Memory, on its file
	// system ("": Staging/memory).
	MemoryStaging string
	// Writer is the sandbox's user, who owns a read_write memory store's
	// directory and files; nil when files need no owner of their own
	// (the sandbox runs as the host agent's user).
	Writer *Owner
	// Staging is where files are written before they are renamed into
	// Uploads: on its file system, and not shown in the sandbox. It may
	// not exist yet (its parent does while the sandbox does).
	Staging string
}

// Owner is a user and group on the host.
type Owner struct{ UID, GID int }
