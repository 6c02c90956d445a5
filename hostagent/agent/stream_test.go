package agent_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The exec stream, heartbeats and reads under load and hostile output:
// what the agent sends is bounded and keeps flowing.

func TestExecStreamsAsProduced(t *testing.T) {
	e := setup(t)
	release := make(chan struct{})
	e.fake.Handle("chatty", func(ctx context.Context, p *drivertest.Proc) int {
		io.WriteString(p.Stdout, "first\n")
		select {
		case <-release:
		case <-ctx.Done():
			return 137
		}
		io.WriteString(p.Stderr, "second\n")
		return 7
	})
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Exec(ctx, &pb.ExecRequest{Key: "s1", Command: []string{"chatty"}})
	if err != nil {
		t.Fatal(err)
	}
	// The first chunk arrives while the command is still running.
	m, err := st.Recv()
	if err != nil || m.GetOutput().GetStream() != pb.OutputStream_OUTPUT_STREAM_STDOUT || string(m.GetOutput().GetData()) != "first\n" {
		t.Fatalf("first message %v, %v", m, err)
	}
	close(release)
	m, err = st.Recv()
	if err != nil || m.GetOutput().GetStream() != pb.OutputStream_OUTPUT_STREAM_STDERR || string(m.GetOutput().GetData()) != "second\n" {
		t.Fatalf("second message %v, %v", m, err)
	}
	m, err = st.Recv()
	if res := m.GetResult(); err != nil || res.GetExitCode() != 7 || string(res.GetStderr()) != "second\n" || res.GetTimedOut() {
		t.Fatalf("result %v, %v", m, err)
	}

	// A time limit gives exit code 124 and timed_out.
	st, err = c.Exec(ctx, &pb.ExecRequest{Key: "s1", Command: []string{"sleep", "30"}, Timeout: durationpb.New(50 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	m, err = st.Recv()
	if res := m.GetResult(); err != nil || !res.GetTimedOut() || res.GetExitCode() != 124 {
		t.Fatalf("timed-out result %v, %v", m, err)
	}
	// Bad requests are refused before reaching the driver.
	if _, _, err := execStream(t, c, "s1"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("exec without a command: %v", err)
	}
}

func TestHeartbeatReportsFailingChecks(t *testing.T) {
	e := setup(t)
	r := e.start()
	defer r.stop()
	e.checkFails.Store(true)
	hb := e.heartbeat(r)
	var probe *pb.Condition
	for _, c := range hb.Conditions {
		if c.Type == "probe" {
			probe = c
		}
	}
	if probe == nil || probe.Ok || !strings.Contains(probe.Message, "no canary today") {
		t.Fatalf("probe condition = %v", probe)
	}
	e.checkFails.Store(false)
	for _, c := range e.heartbeat(r).Conditions {
		if !c.Ok {
			t.Errorf("condition %s still failing: %s", c.Type, c.Message)
		}
	}
}

func TestReconnectsWhenTheStreamBreaks(t *testing.T) {
	e := setup(t)
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	// The control plane goes away...
	e.srv.Stop()
	e.wait("disconnect", func(h hostctl.Host) bool { return !h.Connected })
	// ...and comes back on the same address.
	l, err := net.Listen("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := e.ctl.Serve(l)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	registered := make(chan error, 1)
	go func() {
		registered <- e.ctl.Wait(ctx, func(hs map[string]hostctl.Host) bool { return hs[hostID].Registers == 2 })
	}()
	// Fire the agent's reconnect timer each time it waits on it, until it
	// registered again (gRPC may need a few attempts to redial).
	for done := false; !done; {
		select {
		case e.reconnect <- e.clock.Now():
		case err := <-registered:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		}
	}
	reg := e.ctl.Hosts()[hostID].Register
	if len(reg.Sandboxes) != 1 || reg.Sandboxes[0].Key != "s1" {
		t.Fatalf("re-registered with %v", reg.Sandboxes)
	}
	if n := len(refs(t, e.fake)); n != 1 {
		t.Fatalf("driver holds %d sandboxes after the reconnect, want 1", n)
	}
}

func TestEnsureReplacesALostSandboxAndSaysSo(t *testing.T) {
	e := setup(t)
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	before := refs(t, e.fake)
	// The sandbox disappears behind the agent's back.
	if err := e.fake.Destroy(context.Background(), before[0]); err != nil {
		t.Fatal(err)
	}
	st, err := e.ensure("s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	after := refs(t, e.fake)
	if len(after) != 1 || after[0].ID == before[0].ID {
		t.Fatalf("driver holds %v after ensuring a lost sandbox", after)
	}
	if st.State != pb.SandboxState_SANDBOX_STATE_READY || !strings.Contains(st.Message, "lost") {
		t.Fatalf("status = %v, want ready and a message that the old one was lost", st)
	}
}

func TestOneAgentPerStateDir(t *testing.T) {
	e := setup(t)
	r := e.start()
	_, err := agent.New(context.Background(), e.config())
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "another corral host") {
		t.Fatalf("second agent on the same state dir: %v", err)
	}
	r.stop() // Run returning releases the state dir
	a, err := agent.New(context.Background(), e.config())
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
}

func TestExecStreamIsBounded(t *testing.T) {
	e := setup(t)
	e.fake.Handle("flood", func(ctx context.Context, p *drivertest.Proc) int {
		// 9 MiB: many small writes, then one large one.
		chunk := []byte(strings.Repeat("x", 63) + "\n")
		for range (4 << 20) / len(chunk) {
			if _, err := p.Stdout.Write(chunk); err != nil {
				return 1
			}
		}
		if _, err := p.Stdout.Write(make([]byte, 5<<20)); err != nil {
			return 1
		}
		return 0
	})
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	out, res, err := execStream(t, e.sandboxClient(), "s1", "flood")
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 8<<20 || !res.Truncated || res.ExitCode != 0 {
		t.Fatalf("streamed %d bytes, truncated=%v, exit %d; want 8 MiB streamed and truncated", len(out), res.Truncated, res.ExitCode)
	}
	if len(res.Stdout) > 2<<20 {
		t.Fatalf("the result keeps %d bytes, more than head and tail", len(res.Stdout))
	}
}

// gatedCreate holds every Create until the gate opens.
type gatedCreate struct {
	driver.Driver
	gate chan struct{}
}

func (g gatedCreate) Create(ctx context.Context, spec driver.Spec) (driver.Ref, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return driver.Ref{}, ctx.Err()
	}
	return g.Driver.Create(ctx, spec)
}

func TestHeartbeatsContinueDuringASlowEnsure(t *testing.T) {
	e := setup(t)
	gate := make(chan struct{})
	e.wrap = func(d driver.Driver) driver.Driver { return gatedCreate{Driver: d, gate: gate} }
	r := e.start()
	defer r.stop()
	ensured := make(chan error, 1)
	go func() {
		_, err := e.ensure("slow", nil)
		ensured <- err
	}()
	// The sandbox is still being created, and the host keeps reporting.
	for range 3 {
		if hb := e.heartbeat(r); len(hb.Sandboxes) != 0 {
			t.Fatalf("heartbeat during the ensure reports %v", hb.Sandboxes)
		}
	}
	close(gate)
	if err := <-ensured; err != nil {
		t.Fatal(err)
	}
	if hb := e.heartbeat(r); len(hb.Sandboxes) != 1 || hb.Sandboxes[0].Key != "slow" {
		t.Fatalf("heartbeat after the ensure reports %v", hb.Sandboxes)
	}
}

// TestReadFileIsBounded: a file over the limit (the request's, or the
// host's own) is refused with ResourceExhausted from its size, without the
// agent reading or allocating it; a FIFO is refused at once; a directory
// too large to list is refused.
func TestReadFileIsBounded(t *testing.T) {
	e := setup(t)
	e.fake.Handle("sparse", func(ctx context.Context, p *drivertest.Proc) int {
		f, err := os.Create(filepath.Join(p.Dir, "huge"))
		if err != nil {
			return 1
		}
		defer f.Close()
		if f.Truncate(4<<40) != nil || os.WriteFile(filepath.Join(p.Dir, "mid"), make([]byte, 2<<20), 0o644) != nil ||
			syscall.Mkfifo(filepath.Join(p.Dir, "fifo"), 0o644) != nil {
			return 1
		}
		return 0
	})
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	if _, res, err := execStream(t, c, "s1", "sparse"); err != nil || res.ExitCode != 0 {
		t.Fatalf("making the files: %v %v", res, err)
	}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "huge"})
	runtime.ReadMemStats(&after)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "4.0 TiB") || !strings.Contains(err.Error(), "16.0 MiB") {
		t.Errorf("ReadFile(4 TiB) = %v, want ResourceExhausted naming 4.0 TiB and the 16.0 MiB limit", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Errorf("refusing a 4 TiB file allocated %d bytes", grew)
	}
	if _, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "mid", MaxBytes: 1 << 20}); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "2.0 MiB") {
		t.Errorf("ReadFile(2 MiB, at most 1 MiB) = %v, want ResourceExhausted", err)
	}
	if got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "mid", MaxBytes: 4 << 20}); err != nil || len(got.Data) != 2<<20 {
		t.Errorf("ReadFile(2 MiB, at most 4 MiB): %v", err)
	}
	if _, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "fifo"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ReadFile(fifo) = %v, want InvalidArgument", err)
	}
}
