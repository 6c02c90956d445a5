package integration

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/freeport"
	"corral.dev/corral/internal/metrics/metricstest"
	"corral.dev/corral/internal/seal"
)

var corralBin string

// testSealKey is the seal key file of the test clusters' nodes.
var testSealKey string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "corral-bin-")
	if err != nil {
		panic(err)
	}
	corralBin = filepath.Join(dir, "corral")
	// Every test cluster's nodes share one seal key, as an operator copies
	// it to each node.
	testSealKey = filepath.Join(dir, "seal.key")
	if _, err := seal.Create(testSealKey); err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-o", corralBin, "corral.dev/corral/cmd/corral")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		os.Stderr.WriteString("building corral: " + err.Error() + "\n")
		os.Exit(1)
	}
	// The compiled spawner beside it, as make build leaves them (a
	// pausable host looks for it there).
	build = exec.Command("go", "build", "-o", filepath.Join(dir, "corral-spawn"), "corral.dev/corral/cmd/corral-spawn")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		os.Stderr.WriteString("building corral-spawn: " + err.Error() + "\n")
		os.Exit(1)
	}
	// The cluster tests share one PostgreSQL among their nodes.
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// dataDir returns a data dir the postgres user can reach when tests run as
// root.
func dataDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("/usr/lib/postgresql/15/bin/postgres"); err != nil {
		if _, err2 := exec.LookPath("postgres"); err2 != nil && os.Getenv("CI") == "" {
			t.Skip("PostgreSQL server binaries not installed; `make deps` installs them")
		}
	}
	dir, err := os.MkdirTemp("", "corral-dev-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Where containerd runs, corral dev's host runs gVisor unless told
	// otherwise, with warm pools whose sandboxes a stopped corral dev
	// leaves for its next start: whatever it leaves is swept when the test
	// ends (after the process is stopped: cleanups run last first).
	if _, err := os.Stat(containerdAddress()); err == nil {
		containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
			StateDir: filepath.Join(dir, "host", "containerd")})
	}
	return dir
}

// freeAddr is a loopback address for a child process to listen on.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

type devProcess struct {
	cmd     *exec.Cmd
	stderr  *syncBuffer
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid once done is closed
}

// syncBuffer is a bytes.Buffer safe for the writer goroutine of exec and
// the test reading it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startDev(t *testing.T, dir string, args ...string) *devProcess {
	t.Helper()
	args = append([]string{"dev", "--data-dir", dir}, args...)
	cmd := exec.Command(corralBin, args...)
	p := &devProcess{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	})
	return p
}

// waitListening waits for the one line that says where corral listens.
func (p *devProcess) waitListening(t *testing.T) {
	t.Helper()
	deadline := time.After(90 * time.Second)
	for !strings.Contains(p.stderr.String(), "corral dev listening") {
		select {
		case <-p.done:
			t.Fatalf("corral dev exited (%v) before listening:\n%s", p.waitErr, p.stderr.String())
		case <-deadline:
			t.Fatalf("corral dev did not listen within 90s:\n%s", p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *devProcess) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.waitErr != nil {
			t.Fatalf("corral dev exited with %v after SIGTERM:\n%s", p.waitErr, p.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("corral dev did not exit within 60s of SIGTERM")
	}
}

func readEnv(t *testing.T, dir string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "dev.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			env[k] = v
		}
	}
	return env
}

// postgresProcessesUnder lists the pids of processes whose command line
// names dir.
func postgresProcessesUnder(dir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmdline, "postgres") && strings.Contains(cmdline, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestDevLifecycle(t *testing.T) {
	dir := dataDir(t)
	httpAddr, grpcAddr := freeAddr(t), freeAddr(t)

	first := startDev(t, dir, "--http-addr", httpAddr, "--grpc-addr", grpcAddr)
	first.waitListening(t)
	env := readEnv(t, dir)
	if env["CORRAL_URL"] != "http://"+httpAddr || !strings.HasPrefix(env["CORRAL_API_KEY"], "sk-corral-") || !strings.HasPrefix(env["CORRAL_OPERATOR_KEY"], "sk-corral-") {
		t.Fatalf("dev.env = %v", env)
	}
	// The tenant key works on the public API and the operator key on the
	// fleet; neither on the other's.
	for _, c := range []struct {
		path, key string
		want      int
	}{
		{"/v1/agents", env["CORRAL_API_KEY"], 200},
		{"/v1/agents", env["CORRAL_OPERATOR_KEY"], 403},
		{"/v1/agents", "", 401},
		{"/admin/v1/cluster/status", env["CORRAL_OPERATOR_KEY"], 200},
		{"/admin/v1/cluster/status", env["CORRAL_API_KEY"], 403},
	} {
		req, _ := http.NewRequest("GET", env["CORRAL_URL"]+c.path, nil)
		if c.key != "" {
			req.Header.Set("x-api-key", c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("GET %s = %d, want %d", c.path, resp.StatusCode, c.want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "dev.env")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev.env holds a key and must be private: %v %v", fi.Mode(), err)
	}
	resp, err := http.Get(env["CORRAL_URL"] + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	// Both daemons' metrics, on the loopback ports dev.env names: the
	// requests above are counted by route pattern, the host's sandboxes
	// show by state.
	for _, name := range []string{"CORRAL_METRICS_URL", "CORRAL_HOST_METRICS_URL"} {
		if !strings.HasPrefix(env[name], "http://127.0.0.1:") || !strings.HasSuffix(env[name], "/metrics") {
			t.Fatalf("dev.env %s = %q, want a loopback /metrics URL", name, env[name])
		}
	}
	m := metricstest.Get(t, env["CORRAL_METRICS_URL"])
	if v, _ := m.Value("corral_http_requests_total", map[string]string{"route": "GET /v1/agents", "code": "200"}); v != 1 {
		t.Errorf("corral_http_requests_total{GET /v1/agents, 200} = %v, want 1", v)
	}
	if v, _ := m.Value("corral_http_requests_total", map[string]string{"route": "/v1/", "code": "401"}); v != 1 {
		t.Errorf("corral_http_requests_total{/v1/ (refused before its route), 401} = %v, want 1", v)
	}
	if _, ok := metricstest.Get(t, env["CORRAL_HOST_METRICS_URL"]).Value("corral_host_sandboxes", map[string]string{"state": "ready"}); !ok {
		t.Error("the dev host's metrics have no corral_host_sandboxes{state=ready}")
	}
	if n := strings.Count(first.stderr.String(), "corral dev listening"); n != 1 {
		t.Fatalf("want exactly one line saying where corral listens, got %d", n)
	}
	if strings.Contains(first.stderr.String(), env["CORRAL_API_KEY"]) || strings.Contains(first.stderr.String(), env["CORRAL_OPERATOR_KEY"]) {
		t.Fatal("a key reached the log")
	}

	// A second corral on the same data dir is refused in one line.
	second := exec.Command(corralBin, "dev", "--data-dir", dir, "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t))
	out, err := second.CombinedOutput()
	assertOneLineError(t, out, err, "in use by another corral process")

	if len(postgresProcessesUnder(dir)) == 0 {
		t.Fatal("no postgres process found under the data dir while corral dev runs")
	}
	first.stop(t)
	if pids := postgresProcessesUnder(dir); len(pids) != 0 {
		t.Fatalf("postgres processes %v left behind after SIGTERM", pids)
	}

	// A restart keeps the data: the dev key issued at first start is still
	// in the database (corral dev would issue a new one otherwise).
	again := startDev(t, dir, "--http-addr", httpAddr, "--grpc-addr", grpcAddr)
	again.waitListening(t)
	if got := readEnv(t, dir); got["CORRAL_API_KEY"] != env["CORRAL_API_KEY"] || got["CORRAL_OPERATOR_KEY"] != env["CORRAL_OPERATOR_KEY"] {
		t.Fatalf("keys changed across restarts: the data was not kept")
	}
	if strings.Contains(again.stderr.String(), "initializing postgres cluster") {
		t.Fatal("second start initialized a new cluster")
	}
	again.stop(t)
}

func TestDevBadInput(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"port in use", []string{"dev", "--data-dir", dataDir(t), "--http-addr", busy.Addr().String(), "--grpc-addr", freeAddr(t)}, "address already in use"},
		{"unreachable database", []string{"server", "--database-url", "postgres://u:p@127.0.0.1:1/x", "--http-addr", freeAddr(t), "--grpc-addr", freeAddr(t)}, "connection refused"},
		{"missing database url", []string{"server"}, "--database-url"},
		{"bad flag", []string{"dev", "--no-such-flag"}, "unknown flag"},
		{"migrate without url", []string{"migrate"}, "--database-url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, corralBin, tt.args...).CombinedOutput()
			assertOneLineError(t, out, err, tt.want)
		})
	}
}

func assertOneLineError(t *testing.T, out []byte, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("exit status 0, want failure; output:\n%s", out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit = %v, want status 1 (a panic exits 2); output:\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "corral: ") || !strings.Contains(last, want) {
		t.Fatalf("last line %q, want one line 'corral: ...%s...'; output:\n%s", last, want, out)
	}
	if strings.Contains(string(out), "panic") || strings.Contains(string(out), "goroutine ") {
		t.Fatalf("output looks like a panic:\n%s", out)
	}
}
