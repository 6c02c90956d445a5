package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Sandbox is what the tools need of a session's sandbox. Paths are relative
// to the workspace; the implementation refuses paths that lead outside it
// (kind invalid argument or permission denied) and reports a missing file
// with kind not found.
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
}

// FileInfo is one workspace entry.
type FileInfo struct {
	Path    string // relative to the workspace
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
}

// Remote is a Sandbox served by a host agent's SandboxService.
type Remote struct {
	Client pb.SandboxServiceClient
	Key    string // the sandbox's key on that host
}

var _ Sandbox = Remote{}

// Exec implements Sandbox. Streamed output is dropped: the result carries
// the kept output.
func (r Remote) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	preq := &pb.ExecRequest{Key: r.Key, Command: req.Command, Dir: req.Dir, Stdin: req.Stdin,
		MaxOutputBytes: int64(req.MaxOutput), ExecutionId: req.ExecutionID}
	if req.Timeout > 0 {
		preq.Timeout = durationpb.New(req.Timeout)
	}
	if req.ExecutionID != "" {
		// The host detaches such a command from the call: stop it
		// explicitly when ctx ends (an interrupt, the session's deletion),
		// unless the session is handed over to its next runner, which
		// attaches to it.
		defer func() {
			if ctx.Err() == nil || errors.Is(context.Cause(ctx), agentloop.ErrHandOver) {
				return
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_, _ = r.Client.CancelExec(cctx, &pb.CancelExecRequest{Key: r.Key, ExecutionId: req.ExecutionID})
		}()
	}
	st, err := r.Client.Exec(ctx, preq)
	if err != nil {
		return ExecResult{}, fromRPC("exec", err)
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return ExecResult{}, errdefs.Unavailable("exec in sandbox %s: the stream ended without a result", r.Key)
		}
		if err != nil {
			return ExecResult{}, fromRPC("exec", err)
		}
		if res := m.GetResult(); res != nil {
			return ExecResult{ExitCode: int(res.ExitCode), TimedOut: res.TimedOut, Truncated: res.Truncated, Stdout: res.Stdout, Stderr: res.Stderr}, nil
		}
	}
}

// CancelExec kills the running command of that execution id, if any.
func (r Remote) CancelExec(ctx context.Context, executionID string) error {
	_, err := r.Client.CancelExec(ctx, &pb.CancelExecRequest{Key: r.Key, ExecutionId: executionID})
	return fromRPC("canceling "+executionID, err)
}

// ReadFile implements Sandbox.
func (r Remote) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := r.Client.ReadFile(ctx, &pb.ReadFileRequest{Key: r.Key, Path: path})
	if err != nil {
		return nil, fromRPC("reading "+path, err)
	}
	return resp.Data, nil
}

// WriteFile implements Sandbox.
func (r Remote) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	_, err := r.Client.WriteFile(ctx, &pb.WriteFileRequest{Key: r.Key, Path: path, Data: data, Mode: uint32(mode.Perm())})
	return fromRPC("writing "+path, err)
}

// ListFiles implements Sandbox.
func (r Remote) ListFiles(ctx context.Context, dir string) ([]FileInfo, error) {
	resp, err := r.Client.ListFiles(ctx, &pb.ListFilesRequest{Key: r.Key, Dir: dir})
	if err != nil {
		return nil, fromRPC("listing "+dir, err)
	}
	out := make([]FileInfo, 0, len(resp.Files))
	for _, f := range resp.Files {
		out = append(out, FileInfo{Path: f.Path, Size: f.Size, Mode: fs.FileMode(f.Mode), ModTime: f.ModTime.AsTime()})
	}
	return out, nil
}

// fromRPC keeps the error's kind from the host's gRPC status.
func fromRPC(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, errgrpc.FromStatus(err))
}
