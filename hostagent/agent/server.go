package agent

import (
	"bytes"
	"context"
	"io/fs"
	"sync"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// maxStreamed bounds the output streamed per stream of one command; past it
// chunks are dropped (the result still keeps head and tail).
const maxStreamed = 8 << 20

// sandboxServer serves SandboxService from the agent's sandboxes.
type sandboxServer struct {
	pb.UnimplementedSandboxServiceServer
	a *Agent
}

// use returns the live sandbox for key and marks it busy until done is
// called.
func (a *Agent) use(key string) (sb driver.Sandbox, done func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.boxes[key]
	switch {
	case key == "":
		return nil, nil, errdefs.InvalidArgument("a sandbox key is required")
	case b == nil:
		return nil, nil, errdefs.NotFound("no sandbox %q on host %s", key, a.cfg.HostID)
	case b.rec.State == sandbox.Evicted:
		return nil, nil, errdefs.FailedPrecondition("sandbox %q was evicted from host %s (%s); ensure it again to get its workspace back", key, a.cfg.HostID, b.rec.Message)
	case b.evicting:
		return nil, nil, errdefs.Unavailable("sandbox %q is being evicted from host %s under pressure", key, a.cfg.HostID)
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
	}, nil
}

// Exec streams the command's output, then its result.
func (s *sandboxServer) Exec(req *pb.ExecRequest, stream pb.SandboxService_ExecServer) error {
	if len(req.Command) == 0 {
		return errdefs.InvalidArgument("exec: a command is required")
	}
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return err
	}
	defer done()
	cs := &chunkSender{stream: stream}
	dreq := driver.ExecRequest{
		Command:   req.Command,
		Dir:       req.Dir,
		Env:       req.Env,
		Stdout:    cs.writer(pb.OutputStream_OUTPUT_STREAM_STDOUT),
		Stderr:    cs.writer(pb.OutputStream_OUTPUT_STREAM_STDERR),
		Timeout:   req.Timeout.AsDuration(),
		MaxOutput: int(req.MaxOutputBytes),
	}
	if len(req.Stdin) > 0 {
		dreq.Stdin = bytes.NewReader(req.Stdin)
	}
	res, err := sb.Exec(stream.Context(), dreq)
	if err != nil {
		return err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.err != nil {
		return cs.err
	}
	return stream.Send(&pb.ExecResponse{Msg: &pb.ExecResponse_Result{Result: &pb.ExecResult{
		ExitCode:  int32(res.ExitCode),
		TimedOut:  res.TimedOut,
		Truncated: res.Truncated || cs.dropped,
		Duration:  durationpb.New(res.Duration),
		Stdout:    res.Stdout,
		Stderr:    res.Stderr,
	}}})
}

// chunkSender turns writes on stdout and stderr into OutputChunks on one
// stream.
type chunkSender struct {
	stream pb.SandboxService_ExecServer

	// mu guards the stream's Send and the fields below.
	mu      sync.Mutex
	sent    map[pb.OutputStream]int
	dropped bool
	err     error // first Send error
}

type chunkWriter struct {
	cs *chunkSender
	s  pb.OutputStream
}

func (cs *chunkSender) writer(s pb.OutputStream) *chunkWriter { return &chunkWriter{cs: cs, s: s} }

// Write never fails: the command must not die because the caller went away
// (ctx cancellation stops it instead).
func (w *chunkWriter) Write(p []byte) (int, error) {
	cs := w.cs
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.sent == nil {
		cs.sent = map[pb.OutputStream]int{}
	}
	data := p
	if room := maxStreamed - cs.sent[w.s]; len(data) > room {
		data, cs.dropped = data[:max(room, 0)], true
	}
	if len(data) == 0 || cs.err != nil {
		return len(p), nil
	}
	cs.sent[w.s] += len(data)
	chunk := &pb.OutputChunk{Stream: w.s, Data: append([]byte(nil), data...)}
	cs.err = cs.stream.Send(&pb.ExecResponse{Msg: &pb.ExecResponse_Output{Output: chunk}})
	return len(p), nil
}

func (s *sandboxServer) ReadFile(ctx context.Context, req *pb.ReadFileRequest) (*pb.ReadFileResponse, error) {
	sb, done, err := s.a.use(req.Key)
	if err != nil {
		return nil, err
	}
	defer done()
	data, err := sb.ReadFile(ctx, req.Path)
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
	if err := sb.WriteFile(ctx, req.Path, req.Data, mode); err != nil {
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
	files, err := sb.ListFiles(ctx, req.Dir)
	if err != nil {
		return nil, err
	}
	out := &pb.ListFilesResponse{}
	for _, f := range files {
		out.Files = append(out.Files, &pb.FileInfo{Path: f.Path, Size: f.Size, Mode: uint32(f.Mode), ModTime: timestamppb.New(f.ModTime)})
	}
	return out, nil
}
