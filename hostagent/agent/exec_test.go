package agent_test

import (
	"context"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// realDriver returns the process driver, or the containerd gVisor driver
// (skipping outside root, failing under CI when the runtime is missing),
// and the image its sandboxes take.
func realDriver(t *testing.T, kind string) (driver.Driver, string) {
	t.Helper()
	if kind == "process" {
		d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
		if err != nil {
			t.Fatal(err)
		}
		return d, ""
	}
	return containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor}), "localhost/corral/busybox:1"
}

// call is one Exec stream, read to its end in the background.
type call struct {
	chunks chan string // stdout as it arrives
	done   chan struct{}
	res    *pb.ExecResult
	err    error
	cancel context.CancelFunc
}

func startCall(t *testing.T, c pb.SandboxServiceClient, req *pb.ExecRequest) *call {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cl := &call{chunks: make(chan string, 100), done: make(chan struct{}), cancel: cancel}
	st, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(cl.done)
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				cl.err = errgrpc.FromStatus(err)
				return
			}
			if o := m.GetOutput(); o != nil && o.Stream == pb.OutputStream_OUTPUT_STREAM_STDOUT {
				cl.chunks <- string(o.Data)
			}
			if r := m.GetResult(); r != nil {
				cl.res = r
			}
		}
	}()
	return cl
}

// waitOutput reads the call's stdout until it holds want.
func (cl *call) waitOutput(t *testing.T, want string) {
	t.Helper()
	var got string
	timeout := time.After(60 * time.Second)
	for !strings.Contains(got, want) {
		select {
		case s := <-cl.chunks:
			got += s
		case <-cl.done:
			t.Fatalf("the call ended (%v, %v) with output %q before %q", cl.res, cl.err, got, want)
		case <-timeout:
			t.Fatalf("output %q, still waiting for %q", got, want)
		}
	}
}

func (cl *call) wait(t *testing.T) (*pb.ExecResult, error) {
	t.Helper()
	select {
	case <-cl.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the call did not end")
	}
	return cl.res, cl.err
}

func TestExecIsIdempotentProcess(t *testing.T) { testExecIdempotent(t, "process") }

func TestExecIsIdempotentGVisor(t *testing.T) { testExecIdempotent(t, "gvisor") }

// testExecIdempotent: a command that appends a line to a file and then
// waits, called with one execution id several times (while it runs, after
// its caller went away, after it finished, after an agent restart), runs
// once, and every call gets the same result.
func testExecIdempotent(t *testing.T, kind string) {
	e := setup(t)
	d, image := realDriver(t, kind)
	e.wrap = func(driver.Driver) driver.Driver { return d }
	r := e.start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: image}); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	// The command waits for the file "go", which the test writes.
	script := `echo line >> log; echo started; while [ ! -e go ]; do sleep 0.05; done; echo finished`
	req := &pb.ExecRequest{Key: "s1", Command: []string{"sh", "-c", script}, ExecutionId: "sess-1/tool-1"}

	first := startCall(t, c, req)
	first.waitOutput(t, "started")
	// A second call while it runs attaches: the output so far, then the
	// rest. A third that goes away does not stop the command.
	second := startCall(t, c, req)
	second.waitOutput(t, "started")
	leaver := startCall(t, c, req)
	leaver.waitOutput(t, "started")
	leaver.cancel()
	if _, err := leaver.wait(t); errdefs.KindOf(err) != errdefs.CanceledKind {
		t.Fatalf("the call that left: %v", err)
	}
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "go"}); err != nil {
		t.Fatal(err)
	}
	res1, err1 := first.wait(t)
	res2, err2 := second.wait(t)
	if err1 != nil || err2 != nil || res1.GetExitCode() != 0 || string(res1.GetStdout()) != "started\nfinished\n" {
		t.Fatalf("results %v (%v) and %v (%v)", res1, err1, res2, err2)
	}
	if !proto.Equal(res1, res2) {
		t.Fatalf("the attached call got %v, the first %v", res2, res1)
	}
	// After it finished: the stored result, nothing run.
	third := startCall(t, c, req)
	if res3, err := third.wait(t); err != nil || !proto.Equal(res3, res1) {
		t.Fatalf("the call after the end got %v (%v), want %v", res3, err, res1)
	}
	readLog := func(want string) {
		t.Helper()
		got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "log"})
		if err != nil || string(got.Data) != want {
			t.Fatalf("log = %q (%v), want %q", got.GetData(), err, want)
		}
	}
	readLog("line\n")

	// A caller that goes away (a control-plane node that died) and comes
	// back finds the command it started, finished.
	if _, res, err := execStream(t, c, "s1", "rm", "go"); err != nil || res.ExitCode != 0 {
		t.Fatalf("rm go: %v %v", res, err)
	}
	req2 := proto.Clone(req).(*pb.ExecRequest)
	req2.ExecutionId = "sess-1/tool-2"
	gone := startCall(t, c, req2)
	gone.waitOutput(t, "started")
	gone.cancel()
	gone.wait(t)
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "go"}); err != nil {
		t.Fatal(err)
	}
	back := startCall(t, c, req2)
	if res, err := back.wait(t); err != nil || res.GetExitCode() != 0 || string(res.GetStdout()) != "started\nfinished\n" {
		t.Fatalf("the caller that came back got %v, %v", res, err)
	}
	readLog("line\nline\n")

	// An agent restart keeps finished results.
	r.stop()
	e.wait("disconnect", func(h hostctl.Host) bool { return !h.Connected })
	r = e.start()
	defer r.stop()
	c = e.sandboxClient()
	after := startCall(t, c, req)
	if res, err := after.wait(t); err != nil || !proto.Equal(res, res1) {
		t.Fatalf("after a restart: %v (%v), want %v", res, err, res1)
	}
	readLog("line\nline\n")

	// CancelExec kills it; the id then answers with that outcome.
	req3 := &pb.ExecRequest{Key: "s1", Command: []string{"sh", "-c", "echo started; sleep 600"}, ExecutionId: "sess-1/tool-3"}
	long := startCall(t, c, req3)
	long.waitOutput(t, "started")
	if cr, err := c.CancelExec(ctx, &pb.CancelExecRequest{Key: "s1", ExecutionId: req3.ExecutionId}); err != nil || !cr.Canceled {
		t.Fatalf("CancelExec: %v, %v", cr, err)
	}
	if res, err := long.wait(t); errdefs.KindOf(err) != errdefs.CanceledKind {
		t.Fatalf("the canceled call: %v, %v", res, err)
	}
	again := startCall(t, c, req3)
	if res, err := again.wait(t); errdefs.KindOf(err) != errdefs.CanceledKind {
		t.Fatalf("the canceled execution asked again: %v, %v", res, err)
	}
	if cr, err := c.CancelExec(ctx, &pb.CancelExecRequest{Key: "s1", ExecutionId: req3.ExecutionId}); err != nil || cr.Canceled {
		t.Fatalf("CancelExec of a finished execution: %v, %v", cr, err)
	}

	// Destroying the sandbox forgets its executions, on disk too.
	if err := e.ctl.Destroy(ctx, hostID, "s1"); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(e.stateDir + "/executions"); len(left) != 0 {
		t.Fatalf("kept executions left after destroy: %v", left)
	}
}

// The start of an execution is on disk before its command runs, written
// while the driver sets the command up: a start that cannot be recorded
// keeps the command from running, and the call says so.
func TestExecWhoseStartCannotBeRecordedNeverRuns(t *testing.T) {
	e := setup(t)
	d, image := realDriver(t, "process")
	e.wrap = func(driver.Driver) driver.Driver { return d }
	r := e.start()
	defer r.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: image}); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	run := func(id string) (*pb.ExecResult, error) {
		return startCall(t, c, &pb.ExecRequest{Key: "s1", Command: []string{"sh", "-c", "echo ran >> log"}, ExecutionId: id}).wait(t)
	}
	if res, err := run("sess-1/tool-1"); err != nil || res.GetExitCode() != 0 {
		t.Fatalf("the first call: %v, %v", res, err)
	}
	// The sandbox's executions folder becomes a file: no marker can be
	// written there.
	dir := sandbox.ArchiveDir(filepath.Join(e.stateDir, "executions"), "s1")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := run("sess-1/tool-2"); err == nil || !strings.Contains(err.Error(), "recording the start of execution") {
		t.Fatalf("a call whose start could not be recorded: %v, %v; want its error", res, err)
	}
	got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "log"})
	if err != nil || string(got.Data) != "ran\n" {
		t.Fatalf("log = %q (%v): the command whose start was not recorded ran", got.GetData(), err)
	}
}
