// Package spawntest builds cmd/corral-spawn for tests that make pausable
// sandboxes with the compiled spawner (containerd.Config.SpawnBinary):
// once per test process, as make build does (CGO_ENABLED=0).
package spawntest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

var built struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// Binary returns the path of a corral-spawn built from this tree, building
// it the first time in this process; a build that fails fails tb. Each
// test process has its own file under the temporary directory, and removes
// those of processes that have ended.
func Binary(tb testing.TB) string {
	tb.Helper()
	built.once.Do(func() {
		dir := filepath.Join(os.TempDir(), "corral-spawn-test")
		if built.err = os.MkdirAll(dir, 0o755); built.err != nil {
			return
		}
		removeStale(dir)
		built.path = filepath.Join(dir, "corral-spawn."+strconv.Itoa(os.Getpid()))
		cmd := exec.Command("go", "build", "-o", built.path, "corral.dev/corral/cmd/corral-spawn")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		built.out, built.err = cmd.CombinedOutput()
	})
	if built.err != nil {
		tb.Fatalf("building corral-spawn: %v\n%s", built.err, built.out)
	}
	return built.path
}

// removeStale removes the binaries of test processes that have ended.
func removeStale(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "corral-spawn."))
		if err != nil || syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
