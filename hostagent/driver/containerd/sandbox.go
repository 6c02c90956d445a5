package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/internal/capture"
	"corral.dev/corral/hostagent/driver/internal/workspace"
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

	// mu guards process, the init process spec every exec starts from.
	mu      sync.Mutex
	process *specs.Process
}

func (s *sandbox) Ref() driver.Ref { return s.ref }

func (s *sandbox) ws() workspace.Dir {
	return workspace.Dir{Path: s.dirs.workspace, Owner: &workspace.Owner{UID: SandboxUID, GID: SandboxGID}}
}

func (s *sandbox) ReadFile(ctx context.Context, p string) ([]byte, error) {
	if _, _, err := s.d.load(s.d.ns(ctx), s.ref.ID); err != nil {
		return nil, err
	}
	return s.ws().ReadFile(p)
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
// sandbox goes on, without its old processes.
func (s *sandbox) exec(ctx context.Context, c client.Container, id string, proc *specs.Process, creator cio.Creator) (client.Task, client.Process, error) {
	task, err := c.Task(ctx, nil)
	if err == nil {
		var p client.Process
		if p, err = task.Exec(ctx, id, proc, creator); err == nil {
			return task, p, nil
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
	}
	return *s.process, nil
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

// Exec runs req in the sandbox's task as an extra process.
func (s *sandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
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
	// The marker lets killGroup find the command's process group.
	proc.Env = envList(env, req.Env, map[string]string{execMarker: execID})
	proc.Args = req.Command
	proc.Cwd = path.Join(workspacePath, rel)
	// Under gVisor the command runs as a child of init (spawn.go), so that
	// what it leaves running survives a pause.
	relayed := s.d.cfg.Runtime == RuntimeGVisor
	if relayed {
		proc.Args = relayArgs(execID, req.Stdin != nil, proc.Cwd, proc.Env, req.Command, s.nproc(proc))
	}
	proc.Terminal = false

	timeout, max := req.Timeout, req.MaxOutput
	if timeout <= 0 {
		timeout = driver.DefaultExecTimeout
	}
	if max <= 0 {
		max = driver.DefaultMaxOutput
	}
	stdout, stderr := capture.New(max, req.Stdout), capture.New(max, req.Stderr)
	var stdin *stdinCloser
	streams := cio.WithStreams(nil, stdout, stderr)
	if req.Stdin != nil {
		stdin = &stdinCloser{r: req.Stdin, eof: make(chan struct{})}
		streams = cio.WithStreams(stdin, stdout, stderr)
	}
	task, p, err := s.exec(bg, c, execID, &proc, cio.NewCreator(streams))
	if err != nil {
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
	start := time.Now()
	if err := p.Start(bg); err != nil {
		p.IO().Cancel()
		return driver.ExecResult{}, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "sandbox %s: starting %q", s.ref.ID, req.Command[0])
	}
	if stdin != nil {
		go func() {
			select {
			case <-stdin.eof:
				_ = p.CloseIO(bg, client.WithStdinCloser)
			case <-exited:
			}
		}()
	}
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
		s.killGroup(bg, task, proc, execID)
		_ = p.Kill(bg, syscall.SIGKILL)
		status = <-exited
	case <-ctx.Done():
		s.killGroup(bg, task, proc, execID)
		_ = p.Kill(bg, syscall.SIGKILL)
		<-exited
	}
	grace := ioGrace
	if timedOut || ctx.Err() != nil {
		grace = killedIOGrace
	}
	s.drainIO(p, grace)
	res := driver.ExecResult{
		ExitCode:  int(status.ExitCode()),
		Stdout:    stdout.Bytes(),
		Stderr:    stderr.Bytes(),
		Truncated: stdout.Truncated() || stderr.Truncated(),
		Duration:  time.Since(start),
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if timedOut {
		res.ExitCode, res.TimedOut = driver.TimeoutExitCode, true
	}
	if msg, missing := relayMissing(res.ExitCode, res.Stderr); relayed && missing {
		return driver.ExecResult{}, errdefs.InvalidArgument("sandbox %s: starting %s", s.ref.ID, msg)
	}
	if err := status.Error(); err != nil {
		return res, kindOf(err, "sandbox %s: waiting for %q", s.ref.ID, req.Command[0])
	}
	return res, nil
}

// execMarker is set in every command's environment to its exec id.
const execMarker = "CORRAL_EXEC"

// killScript kills, from inside the sandbox, the process groups of every
// process carrying the marker: the runtime makes each exec'd command a
// process group leader, and its children stay in its group. The runtime's
// own kill reaches only the command itself.
const killScript = `for d in /proc/[0-9]*; do
  tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qx "$1" || continue
  read -r _ _ _ _ pgid _ < "$d/stat" 2>/dev/null && kill -9 -"$pgid" 2>/dev/null
  kill -9 "${d#/proc/}" 2>/dev/null
done; true`

// killGroup kills what a timed out or cancelled command started; best
// effort, bounded in time.
func (s *sandbox) killGroup(ctx context.Context, task client.Task, base specs.Process, execID string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	base.Args = []string{"/bin/sh", "-c", killScript, "kill", execMarker + "=" + execID}
	base.Env = envList()
	base.Cwd = "/"
	id := strings.TrimPrefix(newID(), "corral-")
	p, err := task.Exec(ctx, id, &base, cio.NullIO)
	if err != nil {
		s.d.cfg.Logger.Warn("killing a command's process group", "sandbox", s.ref.ID, "err", err)
		return
	}
	defer func() { _, _ = p.Delete(context.WithoutCancel(ctx)) }()
	exited, err := p.Wait(ctx)
	if err != nil {
		return
	}
	if err := p.Start(ctx); err != nil {
		s.d.cfg.Logger.Warn("killing a command's process group", "sandbox", s.ref.ID, "err", err)
		return
	}
	select {
	case <-exited:
	case <-ctx.Done():
	}
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
