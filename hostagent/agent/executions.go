package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Bounds of the finished executions kept per sandbox, for callers that
// come back for a result (a control-plane node taking over a session).
const (
	keepExecutions   = 64
	keepExecutionFor = time.Hour
)

// execTable holds a sandbox's executions by id: running ones in memory,
// finished ones in memory and as one file each under dir, so an agent
// restart still answers for them. Executions that were running when the
// agent stopped are not known after it (their output went with it).
type execTable struct {
	dir string

	// fileMu is held while a finished execution's file is written (outside
	// mu: the write syncs to disk, and lookups must not wait for it) and by
	// forgetExecutions before it removes dir, so the two never race.
	fileMu sync.Mutex

	// mu guards the fields below.
	mu       sync.Mutex
	running  map[string]*execution
	finished map[string]finishedExec
	gone     bool // the sandbox was destroyed: record nothing more
}

// finishedExec is a finished execution, as kept in memory and on disk.
type finishedExec struct {
	ID         string          `json:"id"`
	FinishedAt time.Time       `json:"finished_at"`
	Result     json.RawMessage `json:"result,omitempty"` // pb.ExecResult in protojson
	ErrKind    string          `json:"error_kind,omitempty"`
	ErrMessage string          `json:"error,omitempty"`
}

// outcome is the stored result, or the error the execution ended with.
func (f finishedExec) outcome() (*pb.ExecResult, error) {
	if f.ErrMessage != "" {
		return nil, &errdefs.Error{Kind: kindNamed(f.ErrKind), Msg: f.ErrMessage}
	}
	res := &pb.ExecResult{}
	if err := protojson.Unmarshal(f.Result, res); err != nil {
		return nil, fmt.Errorf("stored result of execution %s: %w", f.ID, err)
	}
	return res, nil
}

// kindNamed is the error kind of that name (Unknown if none).
func kindNamed(name string) errdefs.Kind {
	for k := errdefs.Unknown; k <= errdefs.DeadlineExceededKind; k++ {
		if k.String() == name {
			return k
		}
	}
	return errdefs.Unknown
}

// hashedName turns a caller-chosen name into a safe path element.
func hashedName(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:12])
}

// executions returns the table of the sandbox for key, loading its
// finished executions from disk on first use.
func (a *Agent) executions(key string) (*execTable, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t := a.execs[key]; t != nil {
		return t, nil
	}
	t := &execTable{dir: sandbox.ArchiveDir(a.cfg.executionsDir(), key), running: map[string]*execution{}, finished: map[string]finishedExec{}}
	if err := t.load(a.cfg.Now()); err != nil {
		return nil, err
	}
	a.execs[key] = t
	return t, nil
}

// load reads the finished executions kept under t.dir, dropping expired
// ones and files that do not parse (a crash mid-write leaves none: writes
// are atomic).
func (t *execTable) load(now time.Time) error {
	ents, err := os.ReadDir(t.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading kept executions: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(t.dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("reading kept execution: %w", err)
		}
		var f finishedExec
		if json.Unmarshal(b, &f) != nil || f.ID == "" || now.Sub(f.FinishedAt) > keepExecutionFor {
			_ = os.Remove(p)
			continue
		}
		t.finished[f.ID] = f
	}
	t.pruneLocked(now)
	return nil
}

// lookup returns the running execution of id, or the finished one (ok
// true), or neither.
func (t *execTable) lookup(id string, now time.Time) (run *execution, fin finishedExec, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.running[id]; e != nil {
		return e, finishedExec{}, false
	}
	f, ok := t.finished[id]
	if ok && now.Sub(f.FinishedAt) > keepExecutionFor {
		return nil, finishedExec{}, false
	}
	return nil, f, ok
}

// add registers a running execution under its id, unless one of that id
// is known already: then it returns that (running or finished) and false.
func (t *execTable) add(e *execution, now time.Time) (run *execution, fin finishedExec, added bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gone {
		return nil, finishedExec{}, false, errdefs.NotFound("the sandbox was destroyed")
	}
	if r := t.running[e.id]; r != nil {
		return r, finishedExec{}, false, nil
	}
	if f, ok := t.finished[e.id]; ok && now.Sub(f.FinishedAt) <= keepExecutionFor {
		return nil, f, false, nil
	}
	t.running[e.id] = e
	return nil, finishedExec{}, true, nil
}

// finish moves e from running to finished and writes its file.
func (t *execTable) finish(e *execution, now time.Time) error {
	res, err := e.outcome()
	f := finishedExec{ID: e.id, FinishedAt: now}
	if err != nil {
		f.ErrKind, f.ErrMessage = errdefs.KindOf(err).String(), err.Error()
	} else {
		b, merr := protojson.Marshal(res)
		if merr != nil {
			return merr
		}
		f.Result = b
	}
	t.mu.Lock()
	delete(t.running, e.id)
	gone := t.gone
	if !gone {
		t.finished[e.id] = f
		t.pruneLocked(now)
	}
	t.mu.Unlock()
	if gone {
		return nil
	}
	b, jerr := json.Marshal(f)
	if jerr != nil {
		return jerr
	}
	t.fileMu.Lock()
	defer t.fileMu.Unlock()
	t.mu.Lock()
	gone = t.gone
	t.mu.Unlock()
	if gone {
		return nil
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return fmt.Errorf("keeping execution %s: %w", e.id, err)
	}
	// 0600: output may carry secrets.
	if err := hostpki.WriteFileAtomic(filepath.Join(t.dir, hashedName(e.id)+".json"), b, 0o600); err != nil {
		return fmt.Errorf("keeping execution %s: %w", e.id, err)
	}
	return nil
}

// pruneLocked forgets expired executions and the oldest past
// keepExecutions. The caller holds t.mu.
func (t *execTable) pruneLocked(now time.Time) {
	var fs []finishedExec
	for _, f := range t.finished {
		fs = append(fs, f)
	}
	slices.SortFunc(fs, func(a, b finishedExec) int { return b.FinishedAt.Compare(a.FinishedAt) })
	for i, f := range fs {
		if i >= keepExecutions || now.Sub(f.FinishedAt) > keepExecutionFor {
			delete(t.finished, f.ID)
			_ = os.Remove(filepath.Join(t.dir, hashedName(f.ID)+".json"))
		}
	}
}

// cancel kills the running execution of id and returns it (nil if there
// was none).
func (t *execTable) cancel(id string) *execution {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.running[id]
	if e != nil {
		e.cancel()
	}
	return e
}

// forgetExecutions drops the executions of the sandbox for key, in memory
// and on disk, killing running ones: the sandbox is being destroyed.
func (a *Agent) forgetExecutions(key string) error {
	a.mu.Lock()
	t := a.execs[key]
	delete(a.execs, key)
	a.mu.Unlock()
	dir := sandbox.ArchiveDir(a.cfg.executionsDir(), key)
	if t != nil {
		t.mu.Lock()
		t.gone = true
		for _, e := range t.running {
			e.cancel()
		}
		t.mu.Unlock()
		t.fileMu.Lock() // a write under way ends first
		defer t.fileMu.Unlock()
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing kept executions of %s: %w", key, err)
	}
	return nil
}

// execIdempotent starts req as the execution of id in the sandbox for key,
// or finds the one of that id, and has the caller follow it.
func (s *sandboxServer) execIdempotent(req *pb.ExecRequest, stream pb.SandboxService_ExecServer) error {
	a := s.a
	t, err := a.executions(req.Key)
	if err != nil {
		return err
	}
	send := stream.Send
	if run, fin, ok := t.lookup(req.ExecutionId, a.cfg.Now()); run != nil {
		return run.follow(stream.Context(), send)
	} else if ok {
		return sendFinished(fin, send)
	}
	sb, done, err := a.use(req.Key)
	if err != nil {
		return err
	}
	// The command outlives the call: only its timeout, CancelExec, the
	// sandbox's destruction or the agent's end stop it.
	ctx, cancel := context.WithCancel(a.ctx)
	e := newExecution(req.ExecutionId, cancel)
	run, fin, added, err := t.add(e, a.cfg.Now())
	switch {
	case err != nil:
		cancel()
		done()
		return err
	case !added && run != nil: // another call started it meanwhile
		cancel()
		done()
		return run.follow(stream.Context(), send)
	case !added:
		cancel()
		done()
		return sendFinished(fin, send)
	}
	a.execWG.Add(1)
	go func() {
		defer a.execWG.Done()
		e.run(ctx, sb, req, done)
		if err := t.finish(e, a.cfg.Now()); err != nil {
			a.log.Warn("keeping an execution's result", "key", req.Key, "execution_id", e.id, "err", err)
		}
	}()
	return e.follow(stream.Context(), send)
}

// sendFinished answers with a finished execution's stored outcome.
func sendFinished(f finishedExec, send func(*pb.ExecResponse) error) error {
	res, err := f.outcome()
	if err != nil {
		return err
	}
	return send(&pb.ExecResponse{Msg: &pb.ExecResponse_Result{Result: res}})
}
