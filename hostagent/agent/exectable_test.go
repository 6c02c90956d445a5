package agent

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"corral.dev/corral/hostagent/sandbox"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// finishOne runs an execution of id through the table's steps as
// execIdempotent does: add, the synced marker, the outcome.
func finishOne(t *testing.T, tb *execTable, id string, now time.Time) {
	t.Helper()
	e := newExecution(id, func() {})
	if _, _, added, err := tb.add(e, now); err != nil || !added {
		t.Fatalf("add %s: %v %v", id, added, err)
	}
	if err := tb.markStarted(e, now); err != nil {
		t.Fatal(err)
	}
	e.result = &pb.ExecResult{ExitCode: 3, Stdout: []byte(id)}
	if err := tb.finish(e, now); err != nil {
		t.Fatal(err)
	}
}

func newTable(dir string) *execTable {
	return &execTable{dir: dir, running: map[string]*execution{}, finished: map[string]finishedExec{}}
}

// An outcome is written without a sync, so a machine crash can leave it
// empty or cut short. Its marker stays until it is pruned, so that such an
// execution loads as lost (its command is never run again), and a whole
// outcome loads as itself.
func TestExecutionOutcomeLostInAMachineCrashLoadsAsLost(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	tb := newTable(dir)
	finishOne(t, tb, "sess/whole", now)
	finishOne(t, tb, "sess/torn", now)
	// What a crash before writeback can leave: the rename, not the data.
	if err := os.Truncate(filepath.Join(dir, finishedFile("sess/torn")), 0); err != nil {
		t.Fatal(err)
	}

	again := newTable(dir)
	lost, err := again.load(now)
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 1 || lost[0] != "sess/torn" {
		t.Fatalf("lost after the crash: %v, want [sess/torn]", lost)
	}
	res, err := again.finished["sess/torn"].outcome()
	if err != nil || res.ExitCode != -1 || res.Lost == "" {
		t.Fatalf("the torn outcome loads as %v, %v; want lost", res, err)
	}
	res, err = again.finished["sess/whole"].outcome()
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "sess/whole" {
		t.Fatalf("the whole outcome loads as %v, %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(dir, startedFile("sess/whole"))); err != nil {
		t.Fatalf("the whole outcome's marker went at load: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, startedFile("sess/torn"))); !os.IsNotExist(err) {
		t.Fatalf("the lost execution's marker is still there (%v): its synced outcome replaces it", err)
	}
}

// Pruning takes an execution's marker with its outcome.
func TestPrunedExecutionsLeaveNoMarker(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	tb := newTable(dir)
	for i := range keepExecutions + 6 {
		finishOne(t, tb, fmt.Sprintf("sess/%d", i), now.Add(time.Duration(i)*time.Millisecond))
	}
	count := func(pattern string) int {
		m, _ := filepath.Glob(filepath.Join(dir, pattern))
		return len(m)
	}
	if o, m := count("*.json"), count("*.started"); o != keepExecutions || m != keepExecutions {
		t.Fatalf("%d outcomes and %d markers kept, want %d of each", o, m, keepExecutions)
	}
	if _, err := os.Stat(filepath.Join(dir, startedFile("sess/0"))); !os.IsNotExist(err) {
		t.Fatalf("the oldest execution's marker outlived its outcome: %v", err)
	}
}

// A sandbox's executions forgotten (its destroy) while a call for its key
// loads them afresh (a call that reaches the host as a drain removes the
// sandbox it moved): the load finds the kept executions whole, or none,
// never files removed under it, and nothing of them is left behind.
func TestExecutionsLoadedWhileForgotten(t *testing.T) {
	a := &Agent{cfg: Config{StateDir: t.TempDir(), Now: time.Now}, log: slog.New(slog.DiscardHandler), execs: map[string]*execTable{}}
	now := time.Now()
	for round := range 20 {
		key := fmt.Sprintf("sesn_%d", round)
		dir := sandbox.ArchiveDir(a.cfg.executionsDir(), key)
		tb := newTable(dir)
		for i := range keepExecutions {
			finishOne(t, tb, fmt.Sprintf("%s/%d", key, i), now)
		}
		done := make(chan error, 1)
		go func() { done <- a.forgetExecutions(key) }()
		for forgotten := false; !forgotten; {
			got, err := a.executions(key)
			if err != nil {
				t.Fatalf("round %d: a load while the executions are forgotten: %v", round, err)
			}
			if n := len(got.finished); n != 0 && n != keepExecutions {
				t.Fatalf("round %d: a load found %d executions of %d", round, n, keepExecutions)
			}
			// The next load starts afresh, as after a forget.
			a.mu.Lock()
			delete(a.execs, key)
			a.mu.Unlock()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
				forgotten = true
			default:
			}
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("round %d: the forgotten executions are still there (%v)", round, err)
		}
	}
	if err := a.sweepForgottenExecutions(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(a.cfg.executionsDir()); len(ents) != 0 {
		t.Fatalf("left under the executions dir: %v", ents)
	}
}
