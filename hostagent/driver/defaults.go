package driver

import "time"

// Defaults every driver applies to a zero field of ExecRequest.
const (
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = 10 * time.Minute
	// DefaultMaxOutput is the bytes kept per stream (head and tail) when a
	// request sets no MaxOutput.
	DefaultMaxOutput = 1 << 20
	// TimeoutExitCode is the exit code of a command killed by its time limit,
	// as timeout(1) reports it.
	TimeoutExitCode = 124
)
