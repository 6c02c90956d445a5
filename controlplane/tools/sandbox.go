package tools

import (
	"context"
	"io/fs"
	"time"
)

// Sandbox is what the tools need of a session's sandbox. Paths are relative
// to the workspace, or absolute beneath one of the session's Mounts; the
// implementation refuses paths that lead outside them, or a write to a
// read-only mount (kind invalid argument or permission denied), and
// reports a missing file with kind not found. ListFiles names entries as
// its directory was named (workspace-relative, or absolute).
type Sandbox interface {
	// Exec runs argv to completion, timeout or ctx's end. A command that
	// timed out has exit code 124 and TimedOut set; one that could not be
	// started is an error.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// ReadFile returns a workspace file's contents.
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// WriteFile creates or replaces a file, creating parent directories;
	// mode 0 means 0644.
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	// ListFiles lists the entries of a workspace directory (not recursive).
	ListFiles(ctx context.Context, dir string) ([]FileInfo, error)
}

// Stepper is a Sandbox with something to do once a tool call has run in
// it: a session's read_write memory stores commit what the call changed.
// AfterStep returns what the model must be told of it, added to the tool
// result ("" for nothing); it reports its own failures there, since the
// tool call ran.
type Stepper interface {
	AfterStep(ctx context.Context) string
}

// ExecRequest is one command.
type ExecRequest struct {
	Command []string
	Dir     string // relative to the workspace; "" is the workspace
	Stdin   []byte
	Timeout time.Duration
	// MaxOutput is the bytes kept per stream, head and tail.
	MaxOutput int
	// ExecutionID, when set, makes the call idempotent on the host: a
	// command of that id runs once, a repeated call attaches to it or gets
	// its stored result (a runner that took the session over after a crash
	// does not run it twice), and the command outlives a caller that
	// vanishes.
	ExecutionID string
}

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode  int
	TimedOut  bool
	Truncated bool // the middle of the output was cut
	Stdout    []byte
	Stderr    []byte
	// Lost, when set, says why the command's end is unknown (its host
	// agent restarted while it ran): it ran, perhaps to completion, and is
	// not run again. ExitCode is -1 and there is no output.
	Lost string
}

// FileInfo is one workspace entry.
type FileInfo struct {
	Path    string // relative to the workspace
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
}
