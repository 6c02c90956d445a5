package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Environment of the host agent process TestExecAfterAgentKilled starts
// (the test binary itself, see TestMain).
const (
	helperStateDir = "CORRAL_TEST_AGENT_STATE_DIR"
	helperProcDir  = "CORRAL_TEST_AGENT_PROCESS_DIR"
	helperAddr     = "CORRAL_TEST_AGENT_CONTROL_PLANE"
	helperToken    = "CORRAL_TEST_AGENT_JOIN_TOKEN"
)

// TestMain runs the tests, or, in the process TestExecAfterAgentKilled
// starts (helperStateDir set), a host agent until it is killed.
func TestMain(m *testing.M) {
	if os.Getenv(helperStateDir) == "" {
		os.Exit(m.Run())
	}
	if err := runHelperAgent(); err != nil {
		fmt.Fprintln(os.Stderr, "helper agent:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runHelperAgent is the host agent process of TestExecAfterAgentKilled.
func runHelperAgent() error {
	var (
		d       driver.Driver
		pools   []agent.PoolClass
		err     error
		runtime = process.Name
	)
	if os.Getenv(helperContainerdDir) != "" {
		d, pools, err = helperDriver()
		runtime = containerd.RuntimeGVisor
	} else {
		d, err = process.New(process.Config{Dir: os.Getenv(helperProcDir), AllowUntrusted: true})
	}
	if err != nil {
		return err
	}
	a, err := agent.New(context.Background(), agent.Config{
		HostID: hostID, ControlPlane: os.Getenv(helperAddr), JoinToken: logging.Secret(os.Getenv(helperToken)),
		StateDir: os.Getenv(helperStateDir), ListenAddr: "127.0.0.1:0", Driver: d, Runtime: runtime, Pools: pools,
	})
	if err != nil {
		return err
	}
	return a.Run(context.Background())
}

// TestExecAfterAgentKilled: a host agent killed with SIGKILL while an
// idempotent command runs, and started again over the same state dir,
// answers that execution id with an outcome that says the command's end is
// lost, every time it is asked, and never runs the command again.
func TestExecAfterAgentKilled(t *testing.T) {
	e := setup(t)
	procDir := t.TempDir()
	// Whatever happens, the commands the agents left go before their folder.
	t.Cleanup(func() {
		d, err := process.New(process.Config{Dir: procDir, AllowUntrusted: true})
		if err != nil {
			return
		}
		refs, _ := d.List(context.Background())
		for _, ref := range refs {
			_ = d.Destroy(context.Background(), ref)
		}
	})
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), helperStateDir+"="+e.stateDir, helperProcDir+"="+procDir,
		helperAddr+"="+e.addr, helperToken+"="+e.token.Reveal())
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.ctl.Wait(ctx, func(hs map[string]hostctl.Host) bool { return hs[hostID].Connected }); err != nil {
		t.Fatalf("waiting for the agent process to connect: %v\n%s", err, out.String())
	}
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1"}); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	// The command counts its runs in a file, then waits for the file "go".
	script := `echo run >> runs; echo started; while [ ! -e go ]; do sleep 0.05; done; echo finished`
	req := &pb.ExecRequest{Key: "s1", Command: []string{"sh", "-c", script}, ExecutionId: "sess-1/tool-1"}
	call := startCall(t, c, req)
	call.waitOutput(t, "started")

	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	killed = true
	e.wait("the killed agent to disconnect", func(h hostctl.Host) bool { return !h.Connected })
	if _, err := call.wait(t); err == nil {
		t.Fatal("the call to the killed agent ended without an error")
	}

	// The same host again, in process, over the same state dir and sandboxes.
	d, err := process.New(process.Config{Dir: procDir, AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	e.wrap = func(driver.Driver) driver.Driver { return d }
	r := e.start()
	defer r.stop()
	c = e.sandboxClient()
	for i := range 2 {
		res, err := startCall(t, c, req).wait(t)
		if err != nil || res.GetExitCode() != -1 || !strings.Contains(res.GetLost(), "restarted while this command ran") ||
			!strings.Contains(res.GetLost(), "exit code and output are lost") {
			t.Fatalf("asking for the execution after the restart (call %d): %v, %v; want a lost result: restarted while it ran", i+1, res, err)
		}
	}
	got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "runs"})
	if err != nil || string(got.Data) != "run\n" {
		t.Fatalf("runs = %q (%v), want the command run once", got.GetData(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "executions", "*", "*.started")); len(left) != 0 {
		t.Fatalf("start markers left after the restart: %v", left)
	}
	// A new execution id runs as usual; once done, its marker stays only
	// beside its outcome (execTable).
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "go"}); err != nil {
		t.Fatal(err)
	}
	req2 := &pb.ExecRequest{Key: "s1", Command: req.Command, ExecutionId: "sess-1/tool-2"}
	if res, err := startCall(t, c, req2).wait(t); err != nil || res.GetExitCode() != 0 {
		t.Fatalf("a new execution after the restart: %v, %v", res, err)
	}
	left, _ := filepath.Glob(filepath.Join(e.stateDir, "executions", "*", "*.started"))
	if len(left) != 1 {
		t.Fatalf("start markers after an execution finished: %v, want its one", left)
	}
	if _, err := os.Stat(strings.TrimSuffix(left[0], ".started") + ".json"); err != nil {
		t.Fatalf("the finished execution's marker has no outcome beside it: %v", err)
	}
	// Destroying the sandbox kills what the killed agent left running.
	if err := e.ctl.Destroy(ctx, hostID, "s1"); err != nil {
		t.Fatal(err)
	}
	waitfor.State(t, 30*time.Second, "no process left in the destroyed sandbox", func() (bool, string) {
		left := processesUnder(procDir)
		return len(left) == 0, fmt.Sprintf("processes %v", left)
	})
}

// processesUnder lists the processes whose working directory is dir or
// below it (one that was removed still shows its path, "(deleted)").
func processesUnder(dir string) []string {
	var left []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && strings.HasPrefix(cwd, dir+string(filepath.Separator)) {
			left = append(left, e.Name()+" in "+cwd)
		}
	}
	return left
}
