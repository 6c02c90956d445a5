package driver

import "time"

// Defaults every driver applies to a zero field of ExecRequest.
const (
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = 10 * time.Minute
	// DefaultMaxOutput is the bytes kept per stream (head and tail) when a
	// request sets no MaxOutput.
	DefaultMaxOutput = 1 << 20
	// DefaultMaxReadBytes bounds a ReadFile whose caller sets no limit, and
	// every ReadFile the host agent serves (its Config may lower it): far
	// below the host protocol's message limit, and above what the file
	// tools read (10 MiB).
	DefaultMaxReadBytes = 16 << 20
	// TimeoutExitCode is the exit code of a command killed by its time limit,
	// as timeout(1) reports it.
	TimeoutExitCode = 124
)
