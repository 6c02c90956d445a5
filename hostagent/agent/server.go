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
	cs := newChunkSender(stream)
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
	dropped, sendErr := cs.finish()
	if err != nil {
		return err
	}
	if sendErr != nil {
		return sendErr
	}
	return stream.Send(&pb.ExecResponse{Msg: &pb.ExecResponse_Result{Result: &pb.ExecResult{
		ExitCode:  int32(res.ExitCode),
		TimedOut:  res.TimedOut,
		Truncated: res.Truncated || dropped,
		Duration:  durationpb.New(res.Duration),
		Stdout:    res.Stdout,
		Stderr:    res.Stderr,
	}}})
}

// maxChunk bounds one OutputChunk.
const maxChunk = 1 << 20

// chunkSender turns writes on stdout and stderr into OutputChunks on one
// stream. Writes only queue: one goroutine sends, and what accumulates
// while it sends goes out together, so a command writing many small pieces
// costs few messages and never waits for the network. Order across the two
// streams is kept.
type chunkSender struct {
	stream pb.SandboxService_ExecServer
	wake   chan struct{} // capacity 1: something is queued
	stop   chan struct{} // closed by finish
	done   chan struct{} // closed when the sender has sent everything

	// mu guards the fields below.
	mu      sync.Mutex
	queue   []*pb.OutputChunk
	sent    map[pb.OutputStream]int // bytes accepted per stream
	dropped bool
	err     error // first Send error
}

func newChunkSender(stream pb.SandboxService_ExecServer) *chunkSender {
	cs := &chunkSender{stream: stream, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		sent: map[pb.OutputStream]int{}}
	go cs.run()
	return cs
}

func (cs *chunkSender) run() {
	defer close(cs.done)
	for {
		select {
		case <-cs.wake:
			cs.flush()
		case <-cs.stop:
			cs.flush()
			return
		}
	}
}

func (cs *chunkSender) flush() {
	cs.mu.Lock()
	q := cs.queue
	cs.queue = nil
	err := cs.err
	cs.mu.Unlock()
	for _, c := range q {
		if err != nil {
			break
		}
		err = cs.stream.Send(&pb.ExecResponse{Msg: &pb.ExecResponse_Output{Output: c}})
	}
	if err != nil {
		cs.mu.Lock()
		cs.err = err
		cs.mu.Unlock()
	}
}

// finish sends what is queued and reports whether output was dropped and
// the first send error.
func (cs *chunkSender) finish() (dropped bool, err error) {
	close(cs.stop)
	<-cs.done
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.dropped, cs.err
}

type chunkWriter struct {
	cs *chunkSender
	s  pb.OutputStream
}

func (cs *chunkSender) writer(s pb.OutputStream) *chunkWriter { return &chunkWriter{cs: cs, s: s} }

// Write never fails and never blocks on the network: the command must not
// die or stall because the caller is slow or gone (ctx cancellation stops
// it instead). Past maxStreamed per stream, output is dropped here (the
// result still keeps head and tail).
func (w *chunkWriter) Write(p []byte) (int, error) {
	cs := w.cs
	cs.mu.Lock()
	data := p
	if room := maxStreamed - cs.sent[w.s]; len(data) > room {
		data, cs.dropped = data[:max(room, 0)], true
	}
	if len(data) == 0 || cs.err != nil {
		cs.mu.Unlock()
		return len(p), nil
	}
	cs.sent[w.s] += len(data)
	for len(data) > 0 {
		n := len(cs.queue)
		if n == 0 || cs.queue[n-1].Stream != w.s || len(cs.queue[n-1].Data) >= maxChunk {
			cs.queue = append(cs.queue, &pb.OutputChunk{Stream: w.s})
			n++
		}
		last := cs.queue[n-1]
		k := min(len(data), maxChunk-len(last.Data))
		last.Data = append(last.Data, data[:k]...)
		data = data[k:]
	}
	cs.mu.Unlock()
	select {
	case cs.wake <- struct{}{}:
	default:
	}
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
