package agent

import (
	"context"
	"crypto/rand"
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
// restart still answers for them. Each also has a marker file
// (<name>.started), written and synced to disk before its command starts:
// after a crash, an execution with a marker and no outcome ran (or may
// still run) with nobody watching, and it is given the outcome
// lostInRestart, so that asking for it again never runs the command a
// second time.
//
// The outcome's file is written atomically (a rename) but not synced: it
// is on the tool call's path, and two syncs there cost about 2 ms a
// command on these machines. An agent that is killed keeps what it wrote
// (the kernel has it); only a crash of the machine can lose it, and then
// the marker, which stays until the outcome is pruned, makes the execution
// lostInRestart rather than unknown.
type execTable struct {
	dir string

	// fileMu is held while an execution's file is written (outside mu: a
	// write may sync to disk, and lookups must not wait for it) and by
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

// startedExec is the marker of an execution whose command was started.
type startedExec struct {
	ID        string    `json:"id"`
	StartedAt time.Time `json:"started_at"`
}

// lostInRestart is the outcome of an execution that was running when the
// agent stopped without recording how it ended (kill -9, a crash, a power
// loss): its command ran, perhaps to completion, but nothing is known of
// its end, and it is not run again.
// It is a result, not an error: the caller reports it as the command's
// outcome, once.
func lostInRestart(s startedExec, now time.Time) finishedExec {
	res := &pb.ExecResult{ExitCode: -1, Lost: fmt.Sprintf("the host agent restarted while this command ran (started %s): it may have run to completion, but its exit code and output are lost",
		s.StartedAt.UTC().Format(time.RFC3339))}
	b, _ := protojson.Marshal(res) // a message of plain fields always encodes
	return finishedExec{ID: s.ID, FinishedAt: now, Result: b}
}

// File names under an execTable's dir.
func finishedFile(id string) string { return hashedName(id) + ".json" }
func startedFile(id string) string  { return hashedName(id) + ".started" }

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
	lost, err := t.load(a.cfg.Now())
	if err != nil {
		return nil, err
	}
	for _, id := range lost {
		a.log.Warn("an execution was running when the agent stopped; its outcome is recorded as lost, and it will not run again", "session_id", key, "execution_id", id)
	}
	a.execs[key] = t
	return t, nil
}

// load reads the executions kept under t.dir, dropping expired ones and
// files that do not parse (a crash mid-write leaves none: writes are
// atomic). An execution that started and never finished (the agent stopped
// while it ran) is recorded as lost in the restart, at now; load returns
// the ids of those.
func (t *execTable) load(now time.Time) (lost []string, err error) {
	ents, err := os.ReadDir(t.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading kept executions: %w", err)
	}
	var started []string
	ended := map[string]bool{} // ids with an outcome on disk, expired or not
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		if strings.HasSuffix(name, ".started") {
			started = append(started, name)
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		p := filepath.Join(t.dir, name)
		b, err := os.ReadFile(p)
		if err != nil {
			return lost, fmt.Errorf("reading kept execution: %w", err)
		}
		var f finishedExec
		if json.Unmarshal(b, &f) != nil || f.ID == "" {
			_ = os.Remove(p)
			continue
		}
		ended[f.ID] = true
		if now.Sub(f.FinishedAt) > keepExecutionFor {
			_ = os.Remove(p)
			continue
		}
		t.finished[f.ID] = f
	}
	for _, name := range started {
		p := filepath.Join(t.dir, name)
		b, err := os.ReadFile(p)
		if err != nil {
			return lost, fmt.Errorf("reading kept execution: %w", err)
		}
		var s startedExec
		if json.Unmarshal(b, &s) != nil || s.ID == "" {
			_ = os.Remove(p)
			continue
		}
		if _, kept := t.finished[s.ID]; kept {
			continue // the marker stays beside its outcome until pruned
		}
		if !ended[s.ID] {
			// Kept, and synced, before the marker goes: a crash in between
			// finds it again and does the same.
			f := lostInRestart(s, now)
			if err := t.write(finishedFile(s.ID), f, true); err != nil {
				return lost, fmt.Errorf("keeping execution %s: %w", s.ID, err)
			}
			t.finished[s.ID] = f
			lost = append(lost, s.ID)
		}
		if err := os.Remove(p); err != nil {
			return lost, fmt.Errorf("removing the marker of execution %s: %w", s.ID, err)
		}
	}
	t.pruneLocked(now)
	return lost, nil
}

// write writes v as JSON to the file name under t.dir, atomically, and
// syncs it to disk when sync is set.
func (t *execTable) write(name string, v any, sync bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	// 0600: output may carry secrets.
	if sync {
		return hostpki.WriteFileAtomic(filepath.Join(t.dir, name), b, 0o600)
	}
	return hostpki.WriteFileRenamed(filepath.Join(t.dir, name), b, 0o600)
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

// markStarted writes e's marker, before its command starts. On an error
// the command must not start.
func (t *execTable) markStarted(e *execution, now time.Time) error {
	t.fileMu.Lock()
	defer t.fileMu.Unlock()
	t.mu.Lock()
	gone := t.gone
	t.mu.Unlock()
	if gone {
		return errdefs.NotFound("the sandbox was destroyed")
	}
	if err := t.write(startedFile(e.id), startedExec{ID: e.id, StartedAt: now}, true); err != nil {
		return fmt.Errorf("recording the start of execution %s: %w", e.id, err)
	}
	return nil
}

// finish writes e's outcome (unsynced, beside its marker: see execTable),
// then moves e from running to finished: whoever sees it finished can count
// on it being kept as long as the machine runs.
func (t *execTable) finish(e *execution, now time.Time) error {
	res, err := e.outcome()
	f := finishedExec{ID: e.id, FinishedAt: now}
	if err == nil {
		f.Result, err = protojson.Marshal(res)
	}
	if err != nil {
		f.Result, f.ErrKind, f.ErrMessage = nil, errdefs.KindOf(err).String(), err.Error()
	}
	t.fileMu.Lock()
	defer t.fileMu.Unlock()
	t.mu.Lock()
	gone := t.gone
	t.mu.Unlock()
	var werr error
	if !gone {
		if werr = t.write(finishedFile(e.id), f, false); werr != nil {
			werr = fmt.Errorf("keeping execution %s: %w", e.id, werr)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.running, e.id)
	if !t.gone {
		t.finished[e.id] = f
		t.pruneLocked(now)
	}
	return werr
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
			// The marker last: while it is there, a machine crash makes the
			// execution lost, never unknown.
			_ = os.Remove(filepath.Join(t.dir, finishedFile(f.ID)))
			_ = os.Remove(filepath.Join(t.dir, startedFile(f.ID)))
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
//
// The directory leaves its name (a rename) in the same critical section
// that drops the table: a table loaded for key from then on (a call that
// comes while a drain removes the sandbox it moved) starts from nothing,
// instead of reading files as they are removed. A crash before the removal
// leaves the renamed directory, which the next start removes
// (sweepForgottenExecutions).
func (a *Agent) forgetExecutions(key string) error {
	a.mu.Lock()
	t := a.execs[key]
	a.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		t.gone = true
		for _, e := range t.running {
			e.cancel()
		}
		t.mu.Unlock()
		t.fileMu.Lock() // a write under way ends first; none comes after
		defer t.fileMu.Unlock()
	}
	dir := sandbox.ArchiveDir(a.cfg.executionsDir(), key)
	gone := dir + forgottenSuffix + newExecutionsTomb()
	a.mu.Lock()
	if a.execs[key] == t {
		delete(a.execs, key)
	}
	err := os.Rename(dir, gone)
	a.mu.Unlock()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("removing kept executions of %s: %w", key, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("removing kept executions of %s: %w", key, err)
	}
	return nil
}

// forgottenSuffix marks a sandbox's executions directory renamed for
// removal (forgetExecutions).
const forgottenSuffix = ".forgotten-"

// newExecutionsTomb is a unique suffix for a directory renamed away.
func newExecutionsTomb() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sweepForgottenExecutions removes what forgetExecutions renamed and did
// not get to remove (the agent stopped in between).
func (a *Agent) sweepForgottenExecutions() error {
	ents, err := os.ReadDir(a.cfg.executionsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), forgottenSuffix) {
			if err := os.RemoveAll(filepath.Join(a.cfg.executionsDir(), e.Name())); err != nil {
				return err
			}
		}
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
	e.observe = a.metrics.observeExec
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
	// At most once, even across a crash: the start is on disk before the
	// command is. The marker is written and synced while the driver sets
	// the command up (its BeforeStart waits for it), not before: the sync
	// is about a millisecond of every tool call. A marker that fails keeps
	// the command from starting, and the execution ends with its error.
	marked := make(chan error, 1)
	go func() { marked <- t.markStarted(e, a.cfg.Now()) }()
	started := sync.OnceValue(func() error { return <-marked })
	a.execWG.Add(1)
	go func() {
		defer a.execWG.Done()
		e.run(ctx, sb, req, started, func() {
			_ = started() // the marker is down (or failed) before the outcome is
			if err := t.finish(e, a.cfg.Now()); err != nil {
				a.log.Warn("keeping an execution's result", "session_id", req.Key, "execution_id", e.id, "err", err)
			}
		}, a.commandDone(req.Key, done))
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
