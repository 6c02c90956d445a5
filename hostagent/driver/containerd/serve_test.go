package containerd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/typeurl/v2"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
)

// The command server (serve.go), through real containerd and gVisor.

// TestCommandsNeedNoExecEach: with the compiled spawner a gVisor
// sandbox's commands run through its command server (serve.go): after the
// first, which starts the server, containerd adds no exec process for a
// command, pausable or not; a command's parent is the server (or, pausable,
// init); and a server killed from inside the sandbox costs the command it
// ran and is replaced by the next.
func TestCommandsNeedNoExecEach(t *testing.T) {
	for _, pausable := range []bool{false, true} {
		t.Run(fmt.Sprintf("pausable=%v", pausable), func(t *testing.T) {
			d := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: pausable})
			ref, sb := create(t, d, driver.Spec{})
			ctx, cancel := context.WithCancel(d.ns(context.Background()))
			defer cancel()
			run(t, sb, "true") // an exec of its own, then the server starts
			awaitServer(t, d, ref.ID)
			events, errs := d.client.Subscribe(ctx, `topic=="/tasks/exec-added"`)
			const n = 10
			for i := range n {
				res := run(t, sb, fmt.Sprintf("echo %d; echo e%d >&2; exit %d", i, i, i%3))
				if string(res.Stdout) != fmt.Sprintf("%d\n", i) || string(res.Stderr) != fmt.Sprintf("e%d\n", i) || res.ExitCode != i%3 {
					t.Fatalf("command %d: %+v", i, res)
				}
			}
			// A marker exec through containerd itself, after the commands:
			// its event is the first one seen if the commands added none.
			if added := execsAdded(t, d, ref, events, errs); !slices.Equal(added, []string{"marker"}) {
				t.Errorf("execs added by the commands: %q, want the marker's only", added)
			}

			srv := d.servers.get(ref.ID)
			if srv == nil {
				t.Fatal("no command server")
			}
			parent := "1"
			if !pausable {
				parent = fmt.Sprint(srv.pid)
			}
			if got := strings.TrimSpace(string(run(t, sb, `read -r l < /proc/self/stat; set -- ${l##*) }; echo $2`).Stdout)); got != parent {
				// The shell's parent: the process that started it.
				t.Errorf("a command's parent is %s, want %s", got, parent)
			}
			// Killed from inside: that command fails, Unavailable; the
			// next runs through a new server.
			_, err := sb.Exec(context.Background(), driver.ExecRequest{Command: []string{"sh", "-c", fmt.Sprintf("kill -9 %d; sleep 30", srv.pid)}, Timeout: time.Minute})
			if !errdefs.IsUnavailable(err) {
				t.Errorf("a command whose server it killed: %v, want Unavailable", err)
			}
			if res := run(t, sb, "echo again"); string(res.Stdout) != "again\n" {
				t.Errorf("after the server was killed: %+v", res)
			}
			next := awaitServer(t, d, ref.ID)
			if next == srv {
				t.Error("the killed server was not replaced")
			}
			if !pausable {
				return
			}
			// A pause ends the server first, at the end of its input:
			// it exits 0, not killed.
			if err := d.Pause(context.Background(), ref); err != nil {
				t.Fatal(err)
			}
			<-next.dead
			if next.code != 0 {
				t.Errorf("the server ended by the pause exited %d, want 0 (the end of its input)", next.code)
			}
			if res := run(t, sb, "echo resumed"); string(res.Stdout) != "resumed\n" {
				t.Errorf("after the resume: %+v", res)
			}
			// A host agent that restarts finds the server its earlier run
			// started (nobody will close its input) and replaces it.
			awaitServer(t, d, ref.ID)
			d2 := newDriver(t, Config{Runtime: RuntimeGVisor, Pausable: true, StateDir: d.cfg.StateDir})
			sb2, err := d2.Attach(context.Background(), ref)
			if err != nil {
				t.Fatal(err)
			}
			if res := run(t, sb2, "echo again"); string(res.Stdout) != "again\n" {
				t.Errorf("through the second driver: %+v", res)
			}
			awaitServer(t, d2, ref.ID)
			if res := run(t, sb2, "echo served"); string(res.Stdout) != "served\n" {
				t.Errorf("through the second driver's server: %+v", res)
			}
		})
	}
}

// awaitServer waits until sandbox id has a command server that runs, and
// returns it.
func awaitServer(t testing.TB, d *Driver, id string) *cmdServer {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		settled := d.servers.settled()
		if srv := d.servers.get(id); srv != nil {
			return srv
		}
		d.serveSoon(id)
		select {
		case <-settled:
		case <-deadline:
			t.Fatalf("sandbox %s has no command server after a minute", id)
		}
	}
}

// TestCancelKillsServedCommands: a served command cancelled while it runs
// is killed with what it started, found by the server's mark of its start
// (serve.go): round after round, since a start in the tick the mark was
// read in is the case that failed (the clocks round differently).
func TestCancelKillsServedCommands(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ref, sb := create(t, d, driver.Spec{})
	run(t, sb, "true")
	awaitServer(t, d, ref.ID)
	for round := range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		var once sync.Once
		done := make(chan error, 1)
		go func() {
			_, err := sb.Exec(ctx, driver.ExecRequest{
				Command: []string{"sh", "-c", "sh -c 'sleep 671' & echo started; sleep 672"},
				Stdout:  writerFunc(func(p []byte) { once.Do(func() { close(started) }) }),
				Timeout: time.Minute,
			})
			done <- err
		}()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("round %d: the command ended before it was cancelled: %v", round, err)
		case <-time.After(time.Minute):
			t.Fatalf("round %d: the command did not start in a minute", round)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: a cancelled command: %v", round, err)
		}
		ps := string(run(t, sb, `for d in /proc/[0-9]*; do tr '\0' ' ' < $d/cmdline 2>/dev/null; echo; done`).Stdout)
		if strings.Contains(ps, "sleep 67") {
			t.Fatalf("round %d: the cancelled command's processes run on:\n%s", round, ps)
		}
	}
}

// writerFunc is a writer that calls f with what is written.
type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// TestCommandWhileServerStartsIsServed: a command that comes while its
// sandbox's command server starts waits for it and is served: an exec of
// its own beside the server's would leave the killer two execs to choose
// from, were it to time out (a timed out command was once spared so).
func TestCommandWhileServerStartsIsServed(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ref, sb := create(t, d, driver.Spec{})
	ctx, cancel := context.WithCancel(d.ns(context.Background()))
	defer cancel()
	events, errs := d.client.Subscribe(ctx, `topic=="/tasks/exec-added"`)
	d.serveSoon(ref.ID)
	if res := run(t, sb, "echo served"); string(res.Stdout) != "served\n" {
		t.Fatalf("the command: %+v", res)
	}
	added := execsAdded(t, d, ref, events, errs)
	if !slices.Equal(added, []string{serveExecID, "marker"}) {
		t.Errorf("execs added: %q, want the server's and the marker's only", added)
	}
}

// execsAdded runs a marker exec ("marker") in ref's task through containerd
// itself and returns the exec ids that events, a subscription to
// /tasks/exec-added made before, saw added to ref's container up to it.
// The namespace's other sandboxes (another test process's) are skipped.
func execsAdded(t *testing.T, d *Driver, ref driver.Ref, events <-chan *events.Envelope, errs <-chan error) []string {
	t.Helper()
	ctx := d.ns(context.Background())
	task := taskOf(t, d, ref)
	spec, err := task.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	marker := *spec.Process
	marker.Args = []string{"true"}
	p, err := task.Exec(ctx, "marker", &marker, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Delete(context.Background(), client.WithProcessKill) })
	var added []string
	for len(added) == 0 || added[len(added)-1] != "marker" {
		select {
		case e := <-events:
			v, err := typeurl.UnmarshalAny(e.Event)
			if err != nil {
				t.Fatal(err)
			}
			if a, _ := v.(*apievents.TaskExecAdded); a != nil && a.ContainerID == ref.ID {
				added = append(added, a.ExecID)
			}
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(time.Minute):
			t.Fatalf("no exec-added event for the marker; saw %q", added)
		}
	}
	return added
}
