package containerd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	cerrdefs "github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/internal/capture"
	"corral.dev/corral/hostagent/internal/workspace"
	"corral.dev/corral/hostagent/spawn"
	"corral.dev/corral/internal/errdefs"
)

// How long output may still be copied after a command exits (or, for
// killedIOGrace, was killed); a background process that keeps the pipes open
// is cut off after it.
const (
	ioGrace       = time.Second
	killedIOGrace = 250 * time.Millisecond
)

type sandbox struct {
	d    *Driver
	ref  driver.Ref
	dirs hostDirs

	// mu guards process, the init process spec every exec starts from,
	// and serve, how its commands may be served (serve.go), both read
	// from its spec.
	mu      sync.Mutex
	process *specs.Process
	serve   serveMode
}

func (s *sandbox) Ref() driver.Ref { return s.ref }

var _ driver.SessionDirs = (*sandbox)(nil)

// SessionDirs implements driver.SessionDirs: the directories behind the
// uploads (bind-mounted read-only; root's, mode 0755), memory and outputs
// mounts, and a staging directory beside them. With a disk image the
// memory directory and its staging are on the image (disk.go).
func (s *sandbox) SessionDirs() driver.Dirs {
	d := driver.Dirs{Uploads: s.dirs.uploads, Outputs: s.dirs.outputs, Memory: s.dirs.memory, Staging: filepath.Join(s.dirs.root, "staging"),
		Writer: &driver.Owner{UID: SandboxUID, GID: SandboxGID}}
	if mounted(s.dirs.memory) {
		// Both through the image's own mount: a rename from one mount to
		// another fails (EXDEV), a bind of the same file system included.
		d.Memory, d.MemoryStaging = filepath.Join(diskMountPath(s.dirs), "memory"), memoryStagingPath(s.dirs)
	}
	return d
}

func (s *sandbox) ws() workspace.Dir {
	return workspace.Dir{Path: s.dirs.workspace, Owner: &workspace.Owner{UID: SandboxUID, GID: SandboxGID}}
}

func (s *sandbox) ReadFile(ctx context.Context, p string, max int64) ([]byte, error) {
	if _, _, err := s.d.load(s.d.ns(ctx), s.ref.ID); err != nil {
		return nil, err
	}
	if max <= 0 {
		max = driver.DefaultMaxReadBytes
	}
	return s.ws().ReadFile(p, max)
}

func (s *sandbox) OpenFile(ctx context.Context, p string) (io.ReadCloser, int64, error) {
	if _, _, err := s.d.load(s.d.ns(ctx), s.ref.ID); err != nil {
		return nil, 0, err
	}
	return s.ws().Open(p)
}

func (s *sandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if _, _, err := s.d.load(s.d.ns(ctx), s.ref.ID); err != nil {
		return err
	}
	return s.ws().WriteFile(p, data, mode)
}

func (s *sandbox) ListFiles(ctx context.Context, dir string) ([]driver.FileInfo, error) {
	if _, _, err := s.d.load(s.d.ns(ctx), s.ref.ID); err != nil {
		return nil, err
	}
	return s.ws().List(dir)
}

// exec creates the process in the sandbox's task. If that fails because
// the init has ended (the sandbox was OOM-killed, or the host rebooted), it
// starts a new init over the same workspace and tries once more: the
// sandbox goes on, without its old processes. A command with input is not
// tried twice (the failed try may have read some of it): its init is made
// to run before the first.
func (s *sandbox) exec(ctx context.Context, c client.Container, id string, proc *specs.Process, creator cio.Creator, input bool) (client.Task, client.Process, error) {
	task, err := c.Task(ctx, nil)
	if input && (err != nil || !running(ctx, task)) {
		if err := s.d.ensureRunning(ctx, c); err != nil {
			return nil, nil, err
		}
		task, err = c.Task(ctx, nil)
	}
	if err == nil {
		var p client.Process
		if p, err = task.Exec(ctx, id, proc, creator); err == nil || input {
			return task, p, err
		}
	}
	if rerr := s.d.ensureRunning(ctx, c); rerr != nil {
		return nil, nil, fmt.Errorf("%w (restarting the sandbox: %v)", err, rerr)
	}
	if task, err = c.Task(ctx, nil); err != nil {
		return nil, nil, err
	}
	p, err := task.Exec(ctx, id, proc, creator)
	return task, p, err
}

// baseProcess is the init process spec every exec starts from, read once
// from the container's metadata.
func (s *sandbox) baseProcess(info containers.Container) (specs.Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.process == nil {
		var spec specs.Spec
		if info.Spec == nil {
			return specs.Process{}, errdefs.FailedPrecondition("sandbox %s has no spec", s.ref.ID)
		}
		if err := json.Unmarshal(info.Spec.GetValue(), &spec); err != nil || spec.Process == nil {
			return specs.Process{}, fmt.Errorf("sandbox %s: reading its spec: %v", s.ref.ID, err)
		}
		s.process = spec.Process
		s.serve = serveModeOf(s.d.cfg.Runtime, spec.Process.Args, spec.Mounts)
	}
	return *s.process, nil
}

// serveMode is how the sandbox's commands may be served; baseProcess
// reads it.
func (s *sandbox) serveMode() serveMode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serve
}

// nproc is the process limit of the sandbox's commands: the init's
// RLIMIT_NPROC less the spawner's headroom.
func (s *sandbox) nproc(proc specs.Process) int64 {
	for _, r := range proc.Rlimits {
		if r.Type == "RLIMIT_NPROC" && r.Hard > spawnHeadroom {
			return int64(r.Hard) - spawnHeadroom
		}
	}
	return withDefaults(driver.Limits{}, s.d.cfg.Limits).Pids
}

// stdinCloser passes a reader through and, at its end, closes the process's
// stdin so the command sees end of file.
type stdinCloser struct {
	r    io.Reader
	once sync.Once
	eof  chan struct{}
}

func (c *stdinCloser) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil {
		c.once.Do(func() { close(c.eof) })
	}
	return n, err
}

// closeAtEOF closes p's stdin once c's reader has ended (nothing to do
// while p runs on, and nothing once it has exited). A nil c does nothing.
func (c *stdinCloser) closeAtEOF(ctx context.Context, p client.Process, exited <-chan client.ExitStatus) {
	if c == nil {
		return
	}
	go func() {
		select {
		case <-c.eof:
			_ = p.CloseIO(ctx, client.WithStdinCloser)
		case <-exited:
		}
	}()
}

// outOfProcessesNote starts the stderr of a command that ran only after
// its sandbox was restarted to make room for it.
const outOfProcessesNote = "corral: the sandbox was out of processes (a fork bomb left running?); it was restarted, ending every process in it and emptying /tmp, so that this command could run\n"

// Exec runs req in the sandbox's task as an extra process. If it cannot
// start because the sandbox has no process left to give (a fork bomb that
// returned at once and runs on, say), the sandbox is restarted over the
// same workspace and the command tried once more, its stderr saying so:
// the session goes on.
func (s *sandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	req.BeforeStart = driver.OnceBeforeStart(req) // the tries below start it once
	res, err := s.execOnce(ctx, req)
	if errors.Is(err, errInitRestarted) {
		if req.Stdin != nil {
			// Some of the input may be gone into the refused process.
			return res, errdefs.Unavailable("sandbox %s: the command could not start: the sandbox's init had stopped and was restarted; run it again", s.ref.ID)
		}
		res, err = s.execOnce(ctx, req)
		if errors.Is(err, errInitRestarted) {
			return res, errdefs.Unavailable("sandbox %s: the command could not start: the sandbox's init stopped again as soon as it was restarted", s.ref.ID)
		}
	}
	if !errors.Is(err, errOutOfProcesses) {
		return res, err
	}
	if req.Stderr != nil {
		_, _ = io.WriteString(req.Stderr, outOfProcessesNote)
	}
	// A new init may take a moment to be ready for commands on a busy
	// host.
	for wait := 100 * time.Millisecond; ; wait *= 2 {
		res, err = s.execOnce(ctx, req)
		if !errors.Is(err, errOutOfProcesses) || wait > 2*time.Second {
			break
		}
		if perr := sleepCtx(ctx, wait); perr != nil {
			return res, perr
		}
	}
	if errors.Is(err, errOutOfProcesses) {
		return res, errdefs.ResourceExhausted("the command could not start: the sandbox is out of processes, even after it was restarted")
	}
	if err == nil {
		res.Stderr = append([]byte(outOfProcessesNote), res.Stderr...)
	}
	return res, err
}

// sleepCtx waits d, or until ctx ends (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errOutOfProcesses is execOnce's error when the sandbox had no process to
// give; it has restarted the sandbox (recoverProcesses).
var errOutOfProcesses = errors.New("the sandbox is out of processes")

// runtimeNote replaces what the runtime itself wrote into a command's
// standard error when the sandbox went from under the command.
const runtimeNote = "corral: the sandbox stopped while this command ran (it was restarted for the next one)\n"

// scrubRuntimeErrors takes out of a command's standard error the lines
// the runtime wrote there about this sandbox (runsc exec reports a
// sandbox that died under it, "waiting on PID n in sandbox "<id>": urpc
// method ... failed", on the exec's stderr): internal detail a tenant must
// not read. They name the sandbox's container id, which is how they are
// told from the command's own output.
func (s *sandbox) scrubRuntimeErrors(stderr []byte) []byte {
	mark := []byte(`in sandbox "` + s.ref.ID + `"`)
	if !bytes.Contains(stderr, mark) {
		return stderr
	}
	var out []byte
	noted := false
	for _, line := range bytes.SplitAfter(stderr, []byte("\n")) {
		if bytes.Contains(line, mark) {
			if !noted {
				out, noted = append(out, runtimeNote...), true
			}
			continue
		}
		out = append(out, line...)
	}
	return out
}

// Why the runtime refused to start a command (startRefused).
type refusal int

const (
	commandRefused  refusal = iota // the command's own fault: not found, say
	initEnded                      // the sandbox has ended, or is ending
	initUnreachable                // the sandbox does not answer, and has not ended
)

// sandboxExitWait is how long a command refused by a sandbox that does
// not answer waits for the sandbox to be reported as exited.
const sandboxExitWait = 5 * time.Second

// startRefused tells why the runtime refused to start a command. A
// sandbox that the OOM killer is ending (under gVisor it holds the memory
// of all its processes) may show no sign of it on the host for a moment
// (hostProcessGone), but it no longer answers: runsc lists the processes
// by asking the Sentry. Such a sandbox is given sandboxExitWait to be
// reported as exited.
func (s *sandbox) startRefused(ctx context.Context, task client.Task) refusal {
	if s.initGone(ctx, task) {
		return initEnded
	}
	if _, err := task.Pids(ctx); err == nil {
		return commandRefused
	}
	if awaitExit(ctx, task, sandboxExitWait) == nil {
		return initEnded
	}
	return initUnreachable
}

// errInitRestarted is execOnce's error when the command could not start
// because the sandbox's init had stopped (killTree's last resort kills it,
// as may the kernel's OOM killer); it has started a new one over the same
// workspace (restartInit).
var errInitRestarted = errors.New("the sandbox's init had stopped")

// running reports whether the task's init runs.
func running(ctx context.Context, task client.Task) bool {
	st, err := task.Status(ctx)
	return err == nil && st.Status == client.Running && !hostProcessGone(task)
}

// initGone reports whether the task's init has exited, or its process on
// the host has, which the shim reports a moment later: an exec into it is
// refused, though containerd accepted it.
func (s *sandbox) initGone(ctx context.Context, task client.Task) bool {
	st, err := task.Status(ctx)
	return err == nil && (st.Status == client.Stopped || st.Status == client.Running && hostProcessGone(task))
}

// hostProcessGone reports whether the task's process on the host (runsc's
// sandbox process under gVisor, which holds every process and all the
// memory of the sandbox; the init under runc) has ended or is ending,
// though its shim may not have said so yet. The kernel's OOM killer ends a
// gVisor sandbox that way when its memory passes the limit (a memory hog,
// or a fork bomb: each address space has a host process of its own under
// systrap), and the runtime refuses every exec into it, unable to reach
// it, until the shim has seen the exit. A process is ending when it is a
// zombie or dead, or has SIGKILL pending (the OOM killer's, while its
// threads exit).
func hostProcessGone(task client.Task) bool {
	return pidGone(task.Pid())
}

// pidGone is hostProcessGone of a task's host pid.
func pidGone(pid uint32) bool {
	if pid == 0 {
		return false
	}
	status, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			if strings.HasPrefix(v, "Z") || strings.HasPrefix(v, "X") {
				return true
			}
		case "ShdPnd", "SigPnd":
			if set, err := strconv.ParseUint(v, 16, 64); err == nil && set&(1<<(syscall.SIGKILL-1)) != 0 {
				return true
			}
		}
	}
	return false
}

// restartInit starts a new init in place of the stopped one and returns
// errInitRestarted, or why it could not.
func (s *sandbox) restartInit(ctx context.Context, c client.Container, cause error) error {
	s.d.cfg.Logger.Warn("a command found the sandbox's init stopped; starting a new one", "sandbox", s.ref.ID, "err", cause)
	if err := s.d.ensureRunning(ctx, c); err != nil {
		return kindOf(err, "sandbox %s: restarting its stopped init", s.ref.ID)
	}
	return errInitRestarted
}

// execOnce runs req in the sandbox's task as an extra process.
func (s *sandbox) execOnce(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	if len(req.Command) == 0 {
		return driver.ExecResult{}, errdefs.InvalidArgument("empty command")
	}
	rel, err := workspace.Clean(req.Dir)
	if err != nil {
		return driver.ExecResult{}, err
	}
	// The process outlives a cancelled ctx long enough to be killed and
	// reaped.
	bg := context.WithoutCancel(s.d.ns(ctx))
	c, info, err := s.d.load(bg, s.ref.ID)
	if err != nil {
		return driver.ExecResult{}, err
	}
	proc, err := s.baseProcess(info)
	if err != nil {
		return driver.ExecResult{}, err
	}
	env := map[string]string{}
	for _, kv := range proc.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	execID := strings.TrimPrefix(newID(), "corral-")
	proc.Env = envList(env, req.Env)
	// This sandbox's spawner (spawn.go), from its own spec: a sandbox made
	// before the host was pausable has none, one made before the host had
	// the compiled spawner the shell's.
	sp := spawnerOf(proc.Args)
	proc.Args = req.Command
	proc.Cwd = path.Join(workspacePath, rel)
	// In a pausable sandbox the command runs as a child of init
	// (spawn.go), so that what it leaves running survives a pause.
	relayed := s.d.spawns()
	switch {
	case relayed && sp == compiledSpawner:
		proc.Args = compiledRelayArgs(req.Stdin != nil, proc.Cwd, proc.Env, req.Command, s.nproc(proc))
		// The command's environment travels in the arguments; the
		// relay's own is the Go runtime's to read, none of the tenant's.
		proc.Env = []string{"PATH=" + sandboxPath}
	case relayed:
		proc.Args = relayArgs(execID, req.Stdin != nil, proc.Cwd, proc.Env, req.Command, s.nproc(proc), sp == shellSpawner)
	}
	proc.Terminal = false
	base := proc
	base.Args, base.Env = nil, nil

	timeout, max := req.Timeout, req.MaxOutput
	if timeout <= 0 {
		timeout = driver.DefaultExecTimeout
	}
	if max <= 0 {
		max = driver.DefaultMaxOutput
	}
	stdout, stderr := capture.New(max, req.Stdout), capture.New(max, req.Stderr)
	if mode := s.serveMode(); mode != serveNone && req.Stdin == nil {
		// Through the sandbox's command server (serve.go): the command
		// as the compiled relay would run it.
		args := spawn.RelayArgs(s.nproc(base), false, proc.Cwd, envList(env, req.Env), req.Command)
		srv := s.server(ctx, mode)
		if srv == nil {
			defer s.d.serveSoon(s.ref.ID)
		}
		if srv != nil {
			task, err := c.Task(bg, nil)
			if err != nil {
				return driver.ExecResult{}, kindOf(err, "sandbox %s: exec %q", s.ref.ID, req.Command[0])
			}
			res, err := s.execServed(ctx, task, srv, base, req, args, stdout, stderr, timeout)
			if !errors.Is(err, errNotServed) {
				return s.relayedResult(bg, task, req, res, err)
			}
			stdout, stderr = capture.New(max, req.Stdout), capture.New(max, req.Stderr)
		}
	}
	var stdin *stdinCloser
	streams := cio.WithStreams(nil, stdout, stderr)
	if req.Stdin != nil {
		stdin = &stdinCloser{r: req.Stdin, eof: make(chan struct{})}
		streams = cio.WithStreams(stdin, stdout, stderr)
	}
	task, p, err := s.exec(bg, c, execID, &proc, cio.NewCreator(streams), req.Stdin != nil)
	if err != nil {
		if outOfProcesses(err) && task != nil {
			return driver.ExecResult{}, s.recoverProcesses(bg, task, err)
		}
		return driver.ExecResult{}, kindOf(err, "sandbox %s: exec %q", s.ref.ID, req.Command[0])
	}
	// Deleting an exec process waits until nothing holds its output open;
	// after a kill, orphaned children may, so it runs in the background.
	defer func() {
		go func() {
			if _, err := p.Delete(bg); err != nil && !errors.Is(err, context.Canceled) {
				s.d.cfg.Logger.Debug("deleting exec process", "sandbox", s.ref.ID, "exec", execID, "err", err)
			}
		}()
	}()
	exited, err := p.Wait(bg)
	if err != nil {
		return driver.ExecResult{}, kindOf(err, "sandbox %s: exec %q", s.ref.ID, req.Command[0])
	}
	if err := req.BeforeStart(); err != nil {
		p.IO().Cancel()
		return driver.ExecResult{}, err
	}
	start := time.Now()
	if err := p.Start(bg); err != nil {
		p.IO().Cancel()
		if outOfProcesses(err) {
			return driver.ExecResult{}, s.recoverProcesses(bg, task, err)
		}
		switch s.startRefused(bg, task) {
		case initEnded:
			return driver.ExecResult{}, s.restartInit(bg, c, err)
		case initUnreachable:
			return driver.ExecResult{}, errdefs.Wrap(errdefs.UnavailableKind, err, "sandbox %s: starting %q: the sandbox does not answer", s.ref.ID, req.Command[0])
		}
		return driver.ExecResult{}, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "sandbox %s: starting %q", s.ref.ID, req.Command[0])
	}
	stdin.closeAtEOF(bg, p, exited)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var (
		status   client.ExitStatus
		timedOut bool
	)
	select {
	case status = <-exited:
	case <-timer.C:
		timedOut = true
		s.killTree(bg, task, proc, start)
		_ = p.Kill(bg, syscall.SIGKILL)
		status = <-exited
	case <-ctx.Done():
		s.killTree(bg, task, proc, start)
		_ = p.Kill(bg, syscall.SIGKILL)
		<-exited
	}
	grace := ioGrace
	if timedOut || ctx.Err() != nil {
		grace = killedIOGrace
	}
	s.drainIO(p, grace)
	res := execResult(int(status.ExitCode()), stdout, stderr, start)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if timedOut {
		res.ExitCode, res.TimedOut = driver.TimeoutExitCode, true
	}
	if timedOut || res.ExitCode != 0 {
		res.Stderr = s.scrubRuntimeErrors(res.Stderr)
	}
	if relayed {
		if res, err := s.relayedResult(bg, task, req, res, nil); err != nil {
			return res, err
		}
	}
	if err := status.Error(); err != nil {
		return res, kindOf(err, "sandbox %s: waiting for %q", s.ref.ID, req.Command[0])
	}
	return res, nil
}

// execResult is the result of a command that ended with code, started at
// start, its output captured in stdout and stderr.
func execResult(code int, stdout, stderr *capture.Buffer, start time.Time) driver.ExecResult {
	return driver.ExecResult{
		ExitCode:  code,
		Stdout:    stdout.Bytes(),
		Stderr:    stderr.Bytes(),
		Truncated: stdout.Truncated() || stderr.Truncated(),
		Duration:  time.Since(start),
	}
}

// relayedResult is the result of a command a relay ran (an exec'd one, or
// the command server), err its error: a command the relay did not find,
// or could not start for want of processes, is that error instead.
func (s *sandbox) relayedResult(ctx context.Context, task client.Task, req driver.ExecRequest, res driver.ExecResult, err error) (driver.ExecResult, error) {
	if err != nil || res.TimedOut {
		return res, err
	}
	if msg, missing := relayMissing(res.ExitCode, res.Stderr); missing {
		return driver.ExecResult{}, errdefs.InvalidArgument("sandbox %s: starting %s", s.ref.ID, msg)
	}
	if msg, missing := relayNoDir(res.ExitCode, res.Stderr); missing {
		// What runsc says of an exec's missing directory, before it
		// starts anything.
		return driver.ExecResult{}, errdefs.InvalidArgument("sandbox %s: starting %q: %s", s.ref.ID, req.Command[0], msg)
	}
	if msg, out := relayOutOfProcesses(res.ExitCode, res.Stderr); out {
		return driver.ExecResult{}, s.recoverProcesses(ctx, task, errors.New(msg))
	}
	return res, nil
}

// outOfProcesses reports whether the runtime could not start a process
// because the sandbox has as many as it may (EAGAIN from fork, which runc
// and runsc report in words).
func outOfProcesses(err error) bool {
	msg := strings.ToLower(err.Error())
	return errors.Is(err, syscall.EAGAIN) || strings.Contains(msg, "try again") || strings.Contains(msg, "resource temporarily unavailable")
}

// recoverProcesses is what execOnce does when the sandbox has no process
// left to give: it restarts the sandbox, so that the command can start, and
// returns errOutOfProcesses. Killing every process but init from inside
// (which the killer could, as gVisor's root) races what fills the sandbox:
// a fork bomb forks on between the passes, and its host processes (one per
// address space under systrap) and memory can reach the sandbox's memory
// limit meanwhile, when the kernel kills the whole sandbox under the
// command about to run. Under runc no process can start to do it at all.
func (s *sandbox) recoverProcesses(ctx context.Context, task client.Task, cause error) error {
	s.d.cfg.Logger.Warn("a sandbox is out of processes; restarting it", "sandbox", s.ref.ID, "err", cause)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.restart(ctx, task); err != nil {
		s.d.cfg.Logger.Error("restarting a sandbox out of processes; the next command tries again", "sandbox", s.ref.ID, "err", err)
	}
	// The cause (the runtime's words, with its wrapper) is logged above.
	return errOutOfProcesses
}

// restart kills the sandbox's task, all its processes, and starts a new
// init over the same workspace, here, once the old one is gone, rather than
// by the next command: an exec into an init still dying is accepted by
// containerd and refused by the runtime. A kill that fails because the
// sandbox has already died (its host process gone: the runtime cannot reach
// it) waits for the shim to see the exit. Bounded by ctx.
func (s *sandbox) restart(ctx context.Context, task client.Task) error {
	exited, err := task.Wait(ctx)
	if err != nil && !cerrdefs.IsNotFound(err) {
		return kindOf(err, "sandbox %s: waiting on its task", s.ref.ID)
	}
	if err == nil {
		if kerr := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); kerr != nil && !cerrdefs.IsNotFound(kerr) && !hostProcessGone(task) {
			return kindOf(kerr, "sandbox %s: killing its processes", s.ref.ID)
		}
		if st := <-exited; st.Error() != nil { // cut short by ctx
			return errdefs.Unavailable("sandbox %s: its init outlived its kill: %v", s.ref.ID, st.Error())
		}
	}
	c, _, err := s.d.load(ctx, s.ref.ID)
	if err != nil {
		return err
	}
	return s.d.ensureRunning(ctx, c)
}

// drainIO waits for the output copy to finish, at most ioGrace.
func (s *sandbox) drainIO(p client.Process, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		p.IO().Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		p.IO().Cancel()
		<-done
	}
}

func (s *sandbox) CreateFile(ctx context.Context, path string, mode fs.FileMode) (io.WriteCloser, error) {
	if _, _, err := s.d.load(s.d.ns(ctx), s.ref.ID); err != nil {
		return nil, err
	}
	return s.ws().Create(path, mode)
}
