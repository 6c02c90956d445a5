package agent

import (
	"context"
	"io/fs"
	"path"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/internal/workspace"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/tracing"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// maxListBytes bounds a ListFiles answer, far below MaxMessageBytes.
const maxListBytes = 8 << 20

// sandboxServer serves SandboxService from the agent's sandboxes.
type sandboxServer struct {
	pb.UnimplementedSandboxServiceServer
	a *Agent
}

// use returns the live sandbox for key and marks it busy until done is
// called. A fenced sandbox is refused (Conflict).
func (a *Agent) use(key string) (sb driver.Sandbox, done func(), err error) {
	return a.useBox(key, false)
}

// useFenced is use for the calls a mover makes of a fenced sandbox (the
// export of its workspace).
func (a *Agent) useFenced(key string) (sb driver.Sandbox, done func(), err error) {
	return a.useBox(key, true)
}

// commandDone is done, the release of a command's use of key's sandbox,
// that also tells the warm pool's refill the command ended (a claimed
// sandbox's first command holds it: pool.commandEnded).
func (a *Agent) commandDone(key string, done func()) func() {
	return func() {
		done()
		a.pool.commandEnded(key)
	}
}

func (a *Agent) useBox(key string, fenced bool) (sb driver.Sandbox, done func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.boxes[key]
	switch {
	case key == "":
		return nil, nil, errdefs.InvalidArgument("a sandbox key is required")
	case b == nil:
		return nil, nil, errdefs.NotFound("no sandbox %q on host %s", key, a.cfg.HostID)
	case !fenced && a.cfg.Now().Before(b.fencedUntil):
		return nil, nil, errdefs.Conflict("sandbox %q on host %s is fenced: a control-plane node is moving it", key, a.cfg.HostID)
	case b.rec.State == sandbox.Evicted:
		return nil, nil, errdefs.FailedPrecondition("sandbox %q was evicted from host %s (%s); ensure it again to get its workspace back", key, a.cfg.HostID, b.rec.Message)
	case b.evicting:
		return nil, nil, errdefs.Unavailable("sandbox %q is being evicted from host %s under pressure", key, a.cfg.HostID)
	case b.pausing:
		return nil, nil, errdefs.Conflict("sandbox %q on host %s is being paused", key, a.cfg.HostID)
	case b.restoring:
		return nil, nil, errdefs.Conflict("sandbox %q on host %s is being restored from a checkpoint", key, a.cfg.HostID)
	case b.rec.State != sandbox.Ready || b.sb == nil:
		return nil, nil, errdefs.FailedPrecondition("sandbox %q is not usable: %s", key, b.rec.Message)
	}
	b.inflight++
	b.rec.LastUsed = a.cfg.Now()
	return b.sb, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		b.inflight--
		b.rec.LastUsed = a.cfg.Now()
		if b.inflight == 0 && b.idle != nil {
			close(b.idle)
			b.idle = nil
		}
	}, nil
}

// Exec streams the command's output, then its result. With an execution
// id it is idempotent: see execIdempotent.
func (s *sandboxServer) Exec(req *pb.ExecRequest, stream pb.SandboxService_ExecServer) error {
	if len(req.Command) == 0 {
		return errdefs.InvalidArgument("exec: a command is required")
	}
	if span := tracing.Recording(stream.Context()); span != nil {
		span.SetAttributes(tracing.SessionIDKey.String(req.Key))
	}
	if req.ResultOnly {
		stream = resultOnly{stream}
	}
	if err := s.a.resumeIfPaused(stream.Context(), req.Key); err != nil {
		return err
	}
	if req.ExecutionId != "" {
		return s.execIdempotent(req, stream)
	}
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return err
	}
	// Tied to the call: the caller going away kills the command.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	e := newExecution("", cancel)
	e.observe = s.a.metrics.observeExec
	go e.run(ctx, sb, req, nil, nil, s.a.commandDone(req.Key, done))
	return e.follow(stream.Context(), stream.Send)
}

// CancelExec kills a running execution and returns once it has ended (the
// driver killed what it started), or when ctx ends first.
func (s *sandboxServer) CancelExec(ctx context.Context, req *pb.CancelExecRequest) (*pb.CancelExecResponse, error) {
	if req.Key == "" || req.ExecutionId == "" {
		return nil, errdefs.InvalidArgument("cancel exec: a sandbox key and an execution id are required")
	}
	t, err := s.a.executions(req.Key)
	if err != nil {
		return nil, err
	}
	e := t.cancel(req.ExecutionId)
	if e == nil {
		return &pb.CancelExecResponse{}, nil
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &pb.CancelExecResponse{Canceled: true}, nil
}

func (s *sandboxServer) ReadFile(ctx context.Context, req *pb.ReadFileRequest) (*pb.ReadFileResponse, error) {
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return nil, err
	}
	defer done()
	max := s.a.cfg.MaxReadBytes
	if req.MaxBytes > 0 && req.MaxBytes < max {
		max = req.MaxBytes
	}
	var data []byte
	if path.IsAbs(req.Path) { // beneath a session mount (mountfiles.go)
		var dir workspace.Dir
		var rel string
		if dir, rel, _, err = mountFile(sb, req.Path, false); err == nil {
			data, err = dir.ReadFile(rel, max)
		}
	} else {
		data, err = sb.ReadFile(ctx, req.Path, max)
	}
	if err != nil {
		return nil, err
	}
	return &pb.ReadFileResponse{Data: data}, nil
}

func (s *sandboxServer) WriteFile(ctx context.Context, req *pb.WriteFileRequest) (*pb.WriteFileResponse, error) {
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return nil, err
	}
	defer done()
	mode := fs.FileMode(req.Mode).Perm()
	if mode == 0 {
		mode = 0o644
	}
	if path.IsAbs(req.Path) {
		dir, rel, _, err := mountFile(sb, req.Path, true)
		if err == nil {
			err = dir.WriteFile(rel, req.Data, mode)
		}
		if err != nil {
			return nil, err
		}
	} else if err := sb.WriteFile(ctx, req.Path, req.Data, mode); err != nil {
		return nil, err
	}
	return &pb.WriteFileResponse{}, nil
}

func (s *sandboxServer) ListFiles(ctx context.Context, req *pb.ListFilesRequest) (*pb.ListFilesResponse, error) {
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return nil, err
	}
	defer done()
	var files []driver.FileInfo
	if path.IsAbs(req.Dir) {
		files, err = listMount(sb, req.Dir)
	} else {
		files, err = sb.ListFiles(ctx, req.Dir)
	}
	if err != nil {
		return nil, err
	}
	out := &pb.ListFilesResponse{}
	size := 0
	for _, f := range files {
		// Each entry costs its path and a few dozen bytes of framing.
		if size += len(f.Path) + 64; size > maxListBytes {
			return nil, errdefs.TooLarge("the directory has too many entries to list (%d); list a directory beneath it, or use bash", len(files))
		}
		out.Files = append(out.Files, &pb.FileInfo{Path: f.Path, Size: f.Size, Mode: uint32(f.Mode), ModTime: timestamppb.New(f.ModTime)})
	}
	return out, nil
}

// resultOnly is an Exec stream that sends the result and drops the output
// chunks, for callers that keep only the result's head and tail.
type resultOnly struct{ pb.SandboxService_ExecServer }

func (r resultOnly) Send(m *pb.ExecResponse) error {
	if m.GetOutput() != nil {
		return nil
	}
	return r.SandboxService_ExecServer.Send(m)
}
