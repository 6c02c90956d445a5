package agent

import (
	"bytes"
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// maxStreamed bounds the output streamed per stream of one command; past it
// chunks are dropped (the result still keeps head and tail).
const maxStreamed = 8 << 20

// maxKeptOutput bounds the output kept in a result per stream, whatever
// the request asks: both streams' head and tail fit in a quarter of
// MaxMessageBytes.
const maxKeptOutput = MaxMessageBytes / 8

// maxChunk bounds one OutputChunk.
const maxChunk = 1 << 20

// execution is one command run through Exec. Its streamed output is
// buffered (up to maxStreamed per stream) so that any number of callers can
// follow it from the start, and its outcome is kept once it finishes.
// Writers never wait for a caller: a slow or vanished caller neither stalls
// nor kills the command.
type execution struct {
	id     string // "" for a command tied to its one caller
	cancel context.CancelFunc
	done   chan struct{} // closed when the outcome is set

	// mu guards the fields below. Bytes of a chunk below its length are
	// never changed once written (appends only grow it), so followers may
	// send them after letting go of mu.
	mu       sync.Mutex
	chunks   []*pb.OutputChunk
	streamed map[pb.OutputStream]int // bytes accepted per stream
	dropped  bool
	changed  chan struct{} // closed and replaced when chunks grow
	result   *pb.ExecResult
	err      error
	// observe, when set, receives the outcome and how long the command ran.
	observe func(*pb.ExecResult, error, time.Duration)
}

func newExecution(id string, cancel context.CancelFunc) *execution {
	return &execution{id: id, cancel: cancel, done: make(chan struct{}),
		streamed: map[pb.OutputStream]int{}, changed: make(chan struct{})}
}

// run runs req in sb to its end under ctx, records the outcome, calls keep
// (if set: it makes the outcome durable before anyone is told of it) and
// release. It is the execution's only writer of the outcome.
func (e *execution) run(ctx context.Context, sb driver.Sandbox, req *pb.ExecRequest, beforeStart func() error, keep, release func()) {
	defer release()
	defer e.cancel()
	dreq := driver.ExecRequest{
		Command:     req.Command,
		Dir:         req.Dir,
		Env:         req.Env,
		Stdout:      e.writer(pb.OutputStream_OUTPUT_STREAM_STDOUT),
		Stderr:      e.writer(pb.OutputStream_OUTPUT_STREAM_STDERR),
		Timeout:     req.Timeout.AsDuration(),
		MaxOutput:   int(min(req.MaxOutputBytes, maxKeptOutput)),
		BeforeStart: beforeStart,
	}
	if len(req.Stdin) > 0 {
		dreq.Stdin = bytes.NewReader(req.Stdin)
	}
	start := time.Now()
	res, err := sb.Exec(ctx, dreq)
	took := time.Since(start)
	e.mu.Lock()
	if err != nil {
		if ctx.Err() != nil && errdefs.KindOf(err) == errdefs.Unknown {
			err = errdefs.Wrap(errdefs.CanceledKind, err, "the command was canceled")
		}
		e.err = err
	} else {
		e.result = &pb.ExecResult{
			ExitCode:  int32(res.ExitCode),
			TimedOut:  res.TimedOut,
			Truncated: res.Truncated || e.dropped,
			Duration:  durationpb.New(res.Duration),
			Stdout:    res.Stdout,
			Stderr:    res.Stderr,
		}
	}
	result, failed := e.result, e.err
	e.mu.Unlock()
	if e.observe != nil {
		e.observe(result, failed, took)
	}
	if keep != nil {
		keep()
	}
	close(e.done)
}

// outcome returns the result or error; call it after done is closed.
func (e *execution) outcome() (*pb.ExecResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.result, e.err
}

// follow sends the output from the start, then the rest as it comes, and
// then the result (or returns the execution's error). It returns early when
// ctx ends or a send fails; the execution goes on.
func (e *execution) follow(ctx context.Context, send func(*pb.ExecResponse) error) error {
	i, off := 0, 0 // the next byte to send: chunk i, offset off
	for {
		e.mu.Lock()
		var out []*pb.OutputChunk
		for i < len(e.chunks) {
			c := e.chunks[i]
			n := len(c.Data)
			if off < n {
				out = append(out, &pb.OutputChunk{Stream: c.Stream, Data: c.Data[off:n:n]})
			}
			if i == len(e.chunks)-1 {
				off = n // the last chunk may still grow
				break
			}
			i, off = i+1, 0
		}
		changed := e.changed
		e.mu.Unlock()
		for _, c := range out {
			if err := send(&pb.ExecResponse{Msg: &pb.ExecResponse_Output{Output: c}}); err != nil {
				return err
			}
		}
		select {
		case <-changed:
			continue
		default:
		}
		select {
		case <-changed:
		case <-e.done:
			// The outcome is set after the last write: one more pass sends
			// what came in since this one, then the result.
			e.mu.Lock()
			more := e.moreLocked(i, off)
			e.mu.Unlock()
			if more {
				continue
			}
			res, err := e.outcome()
			if err != nil {
				return err
			}
			return send(&pb.ExecResponse{Msg: &pb.ExecResponse_Result{Result: res}})
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// moreLocked reports whether output past chunk i, offset off was written.
// The caller holds e.mu.
func (e *execution) moreLocked(i, off int) bool {
	switch {
	case i >= len(e.chunks):
		return false
	case i < len(e.chunks)-1:
		return true
	}
	return off < len(e.chunks[i].Data)
}

type execWriter struct {
	e *execution
	s pb.OutputStream
}

func (e *execution) writer(s pb.OutputStream) *execWriter { return &execWriter{e: e, s: s} }

// Write never fails and never blocks on a caller. Past maxStreamed per
// stream, output is dropped here (the result still keeps head and tail).
// Order across the two streams is kept.
func (w *execWriter) Write(p []byte) (int, error) {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	data := p
	if room := maxStreamed - e.streamed[w.s]; len(data) > room {
		data, e.dropped = data[:max(room, 0)], true
	}
	if len(data) == 0 {
		return len(p), nil
	}
	e.streamed[w.s] += len(data)
	for len(data) > 0 {
		n := len(e.chunks)
		if n == 0 || e.chunks[n-1].Stream != w.s || len(e.chunks[n-1].Data) >= maxChunk {
			e.chunks = append(e.chunks, &pb.OutputChunk{Stream: w.s})
			n++
		}
		last := e.chunks[n-1]
		k := min(len(data), maxChunk-len(last.Data))
		last.Data = append(last.Data, data[:k]...)
		data = data[k:]
	}
	close(e.changed)
	e.changed = make(chan struct{})
	return len(p), nil
}
