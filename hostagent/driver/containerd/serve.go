package containerd

// A gVisor sandbox made with the compiled spawner mounted (Config.
// SpawnBinary) runs its commands through a command server (package spawn's
// serve mode): one process the driver execs into the sandbox at its first
// command and keeps, which runs each command the driver frames on its
// stdin as a relay would and frames back its output and status. A command
// then costs no runsc exec of its own (the runtime's process, its control
// call into the Sentry, the shim's bookkeeping: ~20 ms of each command
// here). In a pausable sandbox the server hands each command to init, so
// what it leaves running survives a pause; in any other it starts the
// command itself, its RLIMIT_NPROC lowered to the sandbox's limit as init
// does, the server and init having spawnHeadroom more.
//
// Pause ends the server before the checkpoint (a restore would kill it, as
// an exec's lineage), under the sandbox's run lock, which starting one
// takes too. A server that ends otherwise
// (its sandbox restarted, a process in it killed it) is dropped and the
// next command starts another. A command with input, every command while
// its sandbox's server starts (in the background, from Create or the
// command that found none), and every command while no server can be
// started (a sandbox made before the spawner was mounted, a server that did
// not say hello), runs as its own exec, as before.
//
// The server runs as the sandbox's user, beside the tenant's code, which
// can kill it, trace it or write to its output: what it frames is read
// within bounds (spawn.MaxOutputFrame a frame), a frame the driver did not
// ask for ends the server, and what the tenant could forge is its own
// commands' results. A tenant that kills it loses the command it ran (an
// Unavailable error) and pays a server's start on the next one.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	cerrdefs "github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/internal/capture"
	"corral.dev/corral/hostagent/spawn"
	"corral.dev/corral/internal/errdefs"
)

// serveExecID is the exec id of a sandbox's command server: one at a
// time, and a server left by an earlier run of the host agent is found by
// it and removed before another starts.
const serveExecID = "corral-serve"

// Bounds of a server's start.
const (
	// helloTimeout bounds the wait for a new server's hello.
	helloTimeout = 10 * time.Second
	// serveRetry is how long after a server failed to start its sandbox's
	// commands run as execs of their own before another is tried.
	serveRetry = time.Minute
	// serveStopTimeout bounds the wait for a server to end at the end of
	// its input, and again after its kill.
	serveStopTimeout = 5 * time.Second
	// servedKillWait bounds the wait for a killed command's exit frame.
	servedKillWait = 10 * time.Second
)

// markSlack is how many ticks the killer's mark is set before the server's
// reading of the clock: gVisor's /proc/uptime, which the server reads, and
// the start times in /proc/<pid>/stat round differently, and a process
// forked just after the reading may start a tick before it (measured: 12
// of 40 forks right after a reading started one tick before it, none
// more). One more tick is margin.
const markSlack = 2

// servers are the driver's command servers, by container id.
type servers struct {
	mu       sync.Mutex
	m        map[string]*cmdServer
	starting map[string]chan struct{} // a server being started: closed when it has, or has not
	failed   map[string]time.Time     // when a server last failed to start
	done     chan struct{}            // closed at the end of each start (settled)
}

// cmdServer is one sandbox's command server.
type cmdServer struct {
	id   string // the container's
	p    client.Process
	in   *io.PipeWriter
	pid  int // in the sandbox
	gone chan struct{}
	dead chan struct{} // closed once its process has exited
	code uint32        // its exit status, once dead is closed
	log  *slog.Logger

	wmu sync.Mutex // one frame written at a time

	mu    sync.Mutex
	next  uint32
	calls map[uint32]*servedCall
	err   error // why it ended, once gone is closed
}

// servedCall is one command in flight.
type servedCall struct {
	stdout, stderr io.Writer
	mark           string // the sandbox clock (ticks) at its start, "" until known
	exit           chan int
}

// serveMode is how a sandbox's commands may be served, read from its spec:
// not at all, by a server handing them to init, or by one starting them.
type serveMode int

const (
	serveNone serveMode = iota
	serveInit
	serveOwn
)

// serveModeOf is the serve mode of a sandbox whose init is initArgs and
// whose mounts are mounts.
func serveModeOf(runtime string, initArgs []string, mounts []specs.Mount) serveMode {
	if runtime != RuntimeGVisor {
		return serveNone
	}
	mounted := false
	for _, m := range mounts {
		mounted = mounted || m.Destination == spawnPath
	}
	switch {
	case !mounted:
		return serveNone
	case spawnerOf(initArgs) == compiledSpawner:
		return serveInit
	case spawnerOf(initArgs) == noSpawner:
		return serveOwn
	}
	return serveNone
}

// server returns the sandbox's command server; nil while it has none,
// when the command runs as an exec of its own and execOnce starts one
// once it has ended (serveSoon): a new sandbox's first command, and a
// resumed one's, neither wait for a server's start nor share the CPU with
// one. A command that comes while one starts waits for it: an exec of its
// own beside the server's start could not tell the killer which of the two
// execs is its own (killScript's search), were it to time out.
func (s *sandbox) server(ctx context.Context, mode serveMode) *cmdServer {
	if mode == serveNone {
		return nil
	}
	srv, starting := s.d.servers.getOrStarting(s.ref.ID)
	if srv != nil || starting == nil {
		return srv
	}
	select {
	case <-starting:
	case <-ctx.Done():
		return nil
	}
	return s.d.servers.get(s.ref.ID)
}

// getOrStarting returns sandbox id's server, or, while one starts, what
// is closed when it has.
func (ss *servers) getOrStarting(id string) (*cmdServer, <-chan struct{}) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if srv := ss.m[id]; srv != nil && !srv.ended() {
		return srv, nil
	}
	return nil, ss.starting[id]
}

// serveSoon starts sandbox id's command server in the background, unless
// it has one, one is starting, or one failed to start in the last
// serveRetry.
func (d *Driver) serveSoon(id string) {
	if start := d.servers.claimStart(id); start {
		go d.serve(id)
	}
}

// serveNow is serveSoon, returning once the server has started or failed
// to: Create calls it for a warm pool's sandbox, whose claim then finds it
// up.
func (d *Driver) serveNow(id string) {
	if start := d.servers.claimStart(id); start {
		d.serve(id)
	}
}

// claimStart reports whether the caller is to start sandbox id's server,
// and marks it starting if so.
func (ss *servers) claimStart(id string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if srv := ss.m[id]; srv != nil && !srv.ended() || ss.starting[id] != nil || time.Since(ss.failed[id]) < serveRetry {
		return false
	}
	if ss.starting == nil {
		ss.m, ss.starting, ss.failed = map[string]*cmdServer{}, map[string]chan struct{}{}, map[string]time.Time{}
	}
	ss.starting[id] = make(chan struct{})
	return true
}

// serve starts sandbox id's server, which claimStart gave the caller to.
func (d *Driver) serve(id string) {
	ss := &d.servers
	srv, err := d.startServerOf(id)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	close(ss.starting[id])
	delete(ss.starting, id)
	if ss.done != nil {
		close(ss.done)
		ss.done = nil
	}
	if err != nil {
		// Failures older than serveRetry say nothing more: the map holds
		// at most a retry interval's failures.
		for other, at := range ss.failed {
			if time.Since(at) >= serveRetry {
				delete(ss.failed, other)
			}
		}
		ss.failed[id] = time.Now()
		d.cfg.Logger.Warn("a sandbox's command server did not start; its commands run as execs of their own for now", "sandbox", id, "err", err)
		return
	}
	if srv == nil {
		return
	}
	ss.m[id] = srv
	go func() {
		<-srv.gone
		ss.drop(srv)
	}()
}

// startServerOf starts sandbox id's command server under its run lock:
// nil, and no error, for a sandbox that is not running (being paused or
// destroyed: its next command says so) or whose commands are not served.
func (d *Driver) startServerOf(id string) (*cmdServer, error) {
	ctx := d.ns(context.Background())
	defer d.lockRun(id)()
	c, info, err := d.load(ctx, id)
	if err != nil {
		return nil, nil
	}
	sb := &sandbox{d: d, ref: d.ref(id, info.Labels), dirs: dirsFor(d.cfg.StateDir, id)}
	base, err := sb.baseProcess(info)
	if err != nil {
		return nil, err
	}
	mode := sb.serveMode()
	if mode == serveNone {
		return nil, nil
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil, nil
	}
	if st, err := task.Status(ctx); err != nil || st.Status != client.Running {
		return nil, nil
	}
	srv, err := sb.startServer(ctx, task, base, mode)
	if err != nil {
		if st, serr := task.Status(ctx); serr != nil || st.Status != client.Running {
			// Destroyed, or stopped, under it: nothing to say.
			return nil, nil
		}
	}
	return srv, err
}

// forget ends sandbox id's server and drops what the driver knows of it:
// the sandbox is going.
func (ss *servers) forget(id string) {
	ss.mu.Lock()
	srv := ss.m[id]
	delete(ss.m, id)
	delete(ss.failed, id)
	ss.mu.Unlock()
	if srv != nil {
		srv.end(errors.New("its sandbox is destroyed"))
	}
}

// settled returns a channel closed when the next server start in progress
// ends, however it ends.
func (ss *servers) settled() <-chan struct{} {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.done == nil {
		ss.done = make(chan struct{})
	}
	return ss.done
}

// get returns sandbox id's server, if it has one that has not ended.
func (ss *servers) get(id string) *cmdServer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if srv := ss.m[id]; srv != nil && !srv.ended() {
		return srv
	}
	return nil
}

// drop forgets srv, if it is still its sandbox's server.
func (ss *servers) drop(srv *cmdServer) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m[srv.id] == srv {
		delete(ss.m, srv.id)
	}
}

// startServer execs a command server into the running task and waits for
// its hello. The caller holds the sandbox's run lock.
func (s *sandbox) startServer(ctx context.Context, task client.Task, base specs.Process, mode serveMode) (*cmdServer, error) {
	if err := removeStaleServer(ctx, task); err != nil {
		return nil, err
	}
	proc := base
	proc.Args = append([]string{spawnPath, "serve"}, spawn.ServeArgs(mode == serveOwn, s.nproc(base))...)
	proc.Env = []string{"PATH=" + sandboxPath}
	proc.Cwd = "/"
	proc.Terminal = false
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	diag := capture.New(4<<10, nil)
	p, err := task.Exec(ctx, serveExecID, &proc, cio.NewCreator(cio.WithStreams(inR, outW, diag)))
	if err != nil {
		return nil, err
	}
	exited, err := p.Wait(ctx)
	if err == nil {
		err = p.Start(ctx)
	}
	if err != nil {
		_, _ = p.Delete(ctx, client.WithProcessKill)
		return nil, err
	}
	srv := &cmdServer{id: s.ref.ID, p: p, in: inW, gone: make(chan struct{}), dead: make(chan struct{}), log: s.d.cfg.Logger, calls: map[uint32]*servedCall{}}
	r := bufio.NewReaderSize(outR, 64<<10)
	hello := make(chan error, 1)
	go func() {
		kind, _, payload, err := spawn.ReadFrame(r, spawn.MaxOutputFrame)
		if err == nil && kind != spawn.FrameHello {
			err = fmt.Errorf("a first frame of kind %q", kind)
		}
		if err == nil {
			srv.pid, err = spawn.ParseHello(payload)
		}
		hello <- err
	}()
	// Its end: the output copied, the process deleted, every call told.
	go func() {
		st := <-exited
		srv.code = st.ExitCode()
		close(srv.dead)
		p.IO().Wait()
		outW.CloseWithError(fmt.Errorf("the command server exited %d", st.ExitCode()))
		inW.Close()
		_, _ = p.Delete(context.WithoutCancel(ctx))
	}()
	timer := time.NewTimer(helloTimeout)
	defer timer.Stop()
	select {
	case err = <-hello:
	case <-timer.C:
		err = errors.New("no hello in " + helloTimeout.String())
	}
	if err != nil {
		_ = p.Kill(ctx, syscall.SIGKILL)
		outR.CloseWithError(err)
		return nil, fmt.Errorf("%w (its stderr: %q)", err, diag.Bytes())
	}
	go srv.demux(r)
	return srv, nil
}

// demux hands each frame to its call until the server's output ends or
// breaks its protocol, then ends the server.
func (srv *cmdServer) demux(r io.Reader) {
	var err error
	for err == nil {
		var (
			kind    byte
			id      uint32
			payload []byte
		)
		kind, id, payload, err = spawn.ReadFrame(r, spawn.MaxOutputFrame)
		if err != nil {
			break
		}
		srv.mu.Lock()
		call := srv.calls[id]
		srv.mu.Unlock()
		if call == nil {
			err = fmt.Errorf("a frame for command %d, which it was not given", id)
			break
		}
		switch kind {
		case spawn.FrameMark:
			var ticks uint64
			if ticks, err = spawn.Mark(payload); err == nil {
				srv.mu.Lock()
				call.mark = fmt.Sprint(max(ticks, markSlack) - markSlack)
				srv.mu.Unlock()
			}
		case spawn.FrameStdout:
			_, _ = call.stdout.Write(payload)
		case spawn.FrameStderr:
			_, _ = call.stderr.Write(payload)
		case spawn.FrameExit:
			var code int
			if code, err = spawn.ExitCode(payload); err == nil {
				srv.mu.Lock()
				delete(srv.calls, id)
				srv.mu.Unlock()
				call.exit <- code
			}
		default:
			err = fmt.Errorf("a frame of kind %q", kind)
		}
	}
	srv.end(err)
}

// end kills the server, if it runs still, and tells the calls in flight.
func (srv *cmdServer) end(err error) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	select {
	case <-srv.gone:
		return
	default:
	}
	srv.err = err
	close(srv.gone)
	srv.in.CloseWithError(err)
	_ = srv.p.Kill(context.Background(), syscall.SIGKILL)
}

// ended reports whether the server has ended.
func (srv *cmdServer) ended() bool {
	select {
	case <-srv.gone:
		return true
	default:
		return false
	}
}

// add registers a call and returns its id.
func (srv *cmdServer) add(call *servedCall) uint32 {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.next++
	srv.calls[srv.next] = call
	return srv.next
}

func (srv *cmdServer) remove(id uint32) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	delete(srv.calls, id)
}

// send writes one start frame.
func (srv *cmdServer) send(id uint32, payload []byte) error {
	srv.wmu.Lock()
	defer srv.wmu.Unlock()
	_, err := srv.in.Write(spawn.AppendFrame(nil, spawn.FrameStart, id, payload))
	return err
}

// stop ends the server at the end of its input (the shim passes it on
// only when told: CloseIO), or by its kill, and waits until its process
// has exited and is deleted.
func (srv *cmdServer) stop(ctx context.Context) {
	srv.in.Close()
	_ = srv.p.CloseIO(ctx, client.WithStdinCloser)
	select {
	case <-srv.dead:
	case <-time.After(serveStopTimeout):
		srv.end(errors.New("it did not end at the end of its input"))
		select {
		case <-srv.dead:
		case <-time.After(serveStopTimeout):
		}
	case <-ctx.Done():
		srv.end(ctx.Err())
	}
	srv.end(errors.New("stopped"))
	if _, err := srv.p.Delete(ctx, client.WithProcessKill); err != nil && !cerrdefs.IsNotFound(err) {
		srv.log.Debug("deleting a command server's process", "sandbox", srv.id, "err", err)
	}
}

// stopServer ends the sandbox's command server, if it has one, before a
// checkpoint: it ends cleanly, its calls told, rather than be saved and
// then killed by the restore (an exec's lineage). The caller holds the
// sandbox's run lock.
func (d *Driver) stopServer(ctx context.Context, id string) {
	if srv := d.servers.get(id); srv != nil {
		srv.stop(ctx)
		d.servers.drop(srv)
	}
}

// removeStaleServer kills a command server in task that this driver did
// not start (an earlier run of the host agent's, whose input nobody will
// close) and, once it has exited, deletes it, so that its exec id is free.
// The delete can take the shim ~10 s (its output's copy gives up).
func removeStaleServer(ctx context.Context, task client.Task) error {
	old, err := task.LoadProcess(ctx, serveExecID, nil)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	var exited <-chan client.ExitStatus
	if err == nil {
		exited, err = old.Wait(ctx)
	}
	if err != nil {
		return fmt.Errorf("removing an earlier command server: %w", err)
	}
	_ = old.Kill(ctx, syscall.SIGKILL) // one that has exited cannot be: its delete says what matters
	select {
	case <-exited:
	case <-time.After(serveStopTimeout):
		return errors.New("removing an earlier command server: it outlived its kill")
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := old.Delete(ctx); err != nil && !cerrdefs.IsNotFound(err) {
		// Deleted meanwhile by whoever else waited on it (a driver of
		// the same host still running, in a test) is deleted all the same.
		if _, lerr := task.LoadProcess(ctx, serveExecID, nil); !cerrdefs.IsNotFound(lerr) {
			return fmt.Errorf("removing an earlier command server: %w", err)
		}
	}
	return nil
}

// errNotServed says a command was not started by the server, which the
// caller then runs as an exec of its own.
var errNotServed = errors.New("the command server did not take the command")

// execServed runs the command args (the relay's) through srv, as execOnce
// runs it as an exec. It returns errNotServed when the command did not
// reach the server.
func (s *sandbox) execServed(ctx context.Context, task client.Task, srv *cmdServer, base specs.Process, req driver.ExecRequest, args []string, stdout, stderr *capture.Buffer, timeout time.Duration) (driver.ExecResult, error) {
	payload, err := spawn.StartPayload(args)
	if err != nil {
		return driver.ExecResult{}, errdefs.InvalidArgument("sandbox %s: %v", s.ref.ID, err)
	}
	call := &servedCall{stdout: stdout, stderr: stderr, exit: make(chan int, 1)}
	id := srv.add(call)
	if err := req.BeforeStart(); err != nil {
		srv.remove(id)
		return driver.ExecResult{}, err
	}
	start := time.Now()
	if err := srv.send(id, payload); err != nil {
		srv.remove(id)
		srv.end(err)
		return driver.ExecResult{}, errNotServed
	}
	bg := context.WithoutCancel(ctx)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var (
		code     int
		timedOut bool
	)
	select {
	case code = <-call.exit:
	case <-srv.gone:
		// Its exit may have come just before the server went.
		select {
		case code = <-call.exit:
		default:
			code = -1
		}
	case <-timer.C:
		timedOut = true
		code = s.killServed(bg, task, srv, call, base, start)
	case <-ctx.Done():
		s.killServed(bg, task, srv, call, base, start)
		srv.remove(id)
	}
	res := execResult(code, stdout, stderr, start)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if timedOut {
		srv.remove(id)
		res.ExitCode, res.TimedOut = driver.TimeoutExitCode, true
		return res, nil
	}
	if code == -1 {
		srv.remove(id)
		srv.mu.Lock()
		why := srv.err
		srv.mu.Unlock()
		return res, errdefs.Unavailable("sandbox %s: the command server ended while %q ran (%v); it may have run", s.ref.ID, req.Command[0], why)
	}
	return res, nil
}

// killServed kills what a served command started (killTree, marked by the
// server's clock) and returns its exit status, once it has ended; -1 if it
// did not end in servedKillWait, or the server went with it.
func (s *sandbox) killServed(ctx context.Context, task client.Task, srv *cmdServer, call *servedCall, base specs.Process, start time.Time) int {
	srv.mu.Lock()
	mark := call.mark
	srv.mu.Unlock()
	s.killTreeMarked(ctx, task, base, start, mark, srv.pid)
	select {
	case code := <-call.exit:
		return code
	case <-srv.gone:
	case <-time.After(servedKillWait):
	}
	return -1
}
