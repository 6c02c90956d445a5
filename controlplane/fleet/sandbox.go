package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// ReplacedNotice starts the first tool result after a session's sandbox
// was lost with its host and placed anew.
const ReplacedNotice = "Note: this session's sandbox was lost with its host and has been replaced by a new, empty one. Files written earlier in this session are gone, and the shell starts again in /workspace."

// SandboxFor returns the session's sandbox, placing it if it has none and
// waiting until it is usable: the tools.SandboxFor of the built-in tools.
// A sandbox placed anew after its host was lost is returned once as a
// tools.Replaced. For a session whose sandbox is ready it reads this
// node's state once and the session's resources (Config.Mounts), and
// calls the host only when the session has files to show (mounts.go).
func (f *Fleet) SandboxFor(ctx context.Context, sessionID string) (tools.Sandbox, error) {
	f.SessionRunning(sessionID) // a tool call: not idle
	p, addr, ok := f.placement(sessionID)
	if ok && usable(p, addr, f.cfg.Now()) && f.known(sessionID, p) {
		if c, err := f.client(p.HostID, addr); err == nil {
			sb := &sandbox{f: f, sessionID: sessionID, hostID: p.HostID, client: c}
			if err := f.mount(ctx, sb); err != nil {
				return nil, err
			}
			return sb, nil
		}
	}
	return f.sandboxSlow(ctx, sessionID)
}

// sandboxSlow places the session's sandbox if needed, waits until it is
// usable and notes a replacement.
func (f *Fleet) sandboxSlow(ctx context.Context, sessionID string) (tools.Sandbox, error) {
	if _, err := f.place(ctx, sessionID, false); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, f.cfg.ReadyTimeout)
	defer cancel()
	p, addr, err := f.waitUsable(wctx, sessionID)
	if errdefs.KindOf(err) == errdefs.ResourceExhaustedKind { // a paused sandbox without room to resume
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("the session's sandbox did not become ready within %v: %w", f.cfg.ReadyTimeout, err)
	}
	c, err := f.client(p.HostID, addr)
	if err != nil {
		return nil, err
	}
	// The files first: a call that fails here is told of a replacement
	// at the next one.
	handle := &sandbox{f: f, sessionID: sessionID, hostID: p.HostID, client: c}
	if err := f.mount(ctx, handle); err != nil {
		return nil, err
	}
	var sb tools.Sandbox = handle
	lost, moved := f.lost(sessionID, p)
	restored, err := f.restore(ctx, sessionID, p, c)
	switch {
	case err != nil:
		// The session goes on, told that its files are gone; the next
		// placement change tries the snapshot again.
		f.log.Warn("restoring a session's workspace from its snapshot", "session_id", sessionID, "host_id", p.HostID, "err", err)
		sb = tools.Replaced{Sandbox: sb, Notice: ReplacedNotice}
	case restored != nil:
		sb = tools.Replaced{Sandbox: sb, Notice: restoredNotice(restored, lost)}
	case lost:
		sb = tools.Replaced{Sandbox: sb, Notice: ReplacedNotice}
	case moved == scheduler.MovedWithoutWorkspace: // its workspace is new, as the shell's place must be
		sb = tools.Replaced{Sandbox: sb, Notice: MovedNotice[moved]}
	case moved != "":
		sb = tools.Noticed{Sandbox: sb, Notice: MovedNotice[moved]}
	}
	return sb, nil
}

// errNotWarm: a placement asked for only if warm (PrepareWarm) would not be.
var errNotWarm = errors.New("no host has a warm sandbox of the session's class")

// place places the session's sandbox (its placement back if it has one),
// after the checks of its class, network and image, and brings the image
// of its packages to the host. With warmOnly it places a session that has
// none only on a host with a warm sandbox of its class, and is errNotWarm
// otherwise.
func (f *Fleet) place(ctx context.Context, sessionID string, warmOnly bool) (scheduler.Placement, error) {
	t, err := tenant.Required(ctx)
	if err != nil {
		return scheduler.Placement{}, err
	}
	class, err := f.sessionClass(ctx, t, sessionID)
	if err != nil {
		return scheduler.Placement{}, err
	}
	req := class.Request
	if f.cfg.RealModel {
		if err := admission.CheckProcessRuntime("a real model", req.Runtime, f.cfg.AllowProcess); err != nil {
			return scheduler.Placement{}, err
		}
	}
	req.SessionID, req.Tenant = sessionID, string(t)
	if f.cfg.AllowedHosts != nil {
		if req.AllowedHosts, err = f.cfg.AllowedHosts(ctx, sessionID); err != nil {
			return scheduler.Placement{}, fmt.Errorf("reading the egress allowlist of session %s: %w", sessionID, err)
		}
		if len(req.AllowedHosts) > 0 && class.NoNetwork {
			return scheduler.Placement{}, errdefs.FailedPrecondition("this session's environment allows hosts, but its sandbox class %s allows no network (policy/classes.yaml network_modes): use a class that allows limited networking", class.Name)
		}
	}
	build, err := f.sessionImage(ctx, sessionID)
	if err != nil {
		return scheduler.Placement{}, err
	}
	if build.Image != "" {
		req.Image = build.Image
	}
	req = f.withPlacement(req)
	if warmOnly && !f.wouldBeWarm(req) {
		return scheduler.Placement{}, errNotWarm
	}
	p, err := f.Place(ctx, req)
	if err != nil {
		if refused := f.notOffered(class, req); refused != nil && errdefs.KindOf(err) == errdefs.ResourceExhaustedKind {
			return scheduler.Placement{}, refused
		}
		if pools, ok := f.poolLimited(req); ok && errdefs.KindOf(err) == errdefs.ResourceExhaustedKind {
			// The tenant is told which of its pools are full, not the
			// fleet's figures; the operator reads those in the log.
			f.log.Info("no host in a tenant's pools has room", "session_id", sessionID, "tenant", t, "pools", pools, "err", err)
			return scheduler.Placement{}, errdefs.ResourceExhausted("no sandbox capacity for this session: no host in the pools this tenant may use (%s) can take it now (runtime %s); it is placed at its next tool call once one can", pools, req.Runtime)
		}
		if errdefs.KindOf(err) == errdefs.ResourceExhaustedKind && f.shareLimited(req) {
			// The tenant is told why, not the fleet's figures.
			f.log.Info("a tenant's sandboxes hold their share of the hosts", "session_id", sessionID, "tenant", t, "err", err)
			return scheduler.Placement{}, errdefs.ResourceExhausted("no sandbox capacity for this session: this tenant's sandboxes already hold their share of every host that has room for it (runtime %s); deleting idle sessions frees theirs", req.Runtime)
		}
		if errdefs.KindOf(err) == errdefs.ResourceExhaustedKind {
			return scheduler.Placement{}, errdefs.Wrap(errdefs.ResourceExhaustedKind, err, "no sandbox capacity for this session (runtime %s)", req.Runtime)
		}
		return scheduler.Placement{}, fmt.Errorf("placing the session's sandbox: %w", err)
	}
	if err := f.checkHost(ctx, p); err != nil {
		return scheduler.Placement{}, err
	}
	if err := f.ensureImage(ctx, build, p.HostID); err != nil {
		return scheduler.Placement{}, fmt.Errorf("bringing the image of this session's packages to host %s: %w", p.HostID, err)
	}
	return p, nil
}

// wouldBeWarm reports whether, on this node's state, req (of a session
// with no placement) would go to a host with a warm sandbox for it. A
// sandbox with an egress network never comes from a pool.
func (f *Fleet) wouldBeWarm(req scheduler.Request) bool {
	if len(req.AllowedHosts) > 0 {
		return false
	}
	var (
		plan scheduler.Plan
		err  error
	)
	f.node.Read(func(v raftfsm.View) { plan, err = scheduler.Place(v, req, f.cfg.Scheduler) })
	return err == nil && !plan.Existing && plan.WarmAvailable
}

// AnyWarm reports whether, on this node's state, some host has a warm
// sandbox of any class.
func (f *Fleet) AnyWarm() bool {
	warm := false
	f.node.Read(func(v raftfsm.View) {
		for _, h := range v.Hosts() {
			for _, n := range h.Warm {
				if n > 0 {
					warm = true
					return
				}
			}
		}
	})
	return warm
}

// Prepare places, in the background, the sandbox of a session whose turn
// is starting and that has none: its host makes it ready (or claims one of
// its warm pool) while the model writes its first answer, so the turn's
// first tool call finds it placed and waits only for what is left. A
// session with a placement, a self-hosted one, one whose agent uses no
// sandbox tools, and one already being prepared are left alone. What goes
// wrong is the tool call's to report (it places again, and says why it
// cannot): Prepare only logs it at debug.
func (f *Fleet) Prepare(ctx context.Context, sessionID string) {
	f.prepare(ctx, sessionID, false)
}

// PrepareWarm is Prepare for a session just created, only when a host has
// a warm sandbox of its class: the claim binds the session's identity at
// once, so that its first tool call finds its sandbox ready, and the host
// refills its pool. A session that would get a cold sandbox gets none
// before its first turn, as before: a session never used costs a pool's
// sandbox at most, which the idle pause and deletion give back.
func (f *Fleet) PrepareWarm(ctx context.Context, sessionID string) {
	f.prepare(ctx, sessionID, true)
}

func (f *Fleet) prepare(ctx context.Context, sessionID string, warmOnly bool) {
	t, ok := tenant.From(ctx)
	if !ok {
		return
	}
	placed := false
	f.node.Read(func(v raftfsm.View) { _, placed = v.Placement(sessionID) })
	if placed {
		return
	}
	f.mu.Lock()
	if f.preparing[sessionID] || f.ctx.Err() != nil {
		f.mu.Unlock()
		return
	}
	f.preparing[sessionID] = true
	f.prepares.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.prepares.Done()
		defer func() {
			f.mu.Lock()
			delete(f.preparing, sessionID)
			f.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(tenant.With(f.ctx, t), f.cfg.ReadyTimeout)
		defer cancel()
		needs, err := f.cfg.Sessions.NeedsSandbox(ctx, sessionID)
		if err == nil && needs {
			_, err = f.place(ctx, sessionID, warmOnly)
			if err == nil && warmOnly {
				// Idle until its first turn: paused after the idle
				// interval like any idle session's (a tool call of a turn
				// under way meanwhile cancels it, or resumes the sandbox).
				f.SessionIdle(sessionID)
			}
		}
		if err != nil && f.ctx.Err() == nil && !errors.Is(err, errNotWarm) {
			f.log.Debug("placing a session's sandbox as its turn starts; its first tool call places it", "session_id", sessionID, "err", err)
		}
	}()
}

// shareLimited reports whether, on this node's state, some host that
// could run req refuses it only for its tenant's share of the host. The
// refusal came through Raft, as an error kind and a message; Place applied
// it here before returning, so this state is at least as new.
func (f *Fleet) shareLimited(req scheduler.Request) bool {
	var err error
	f.node.Read(func(v raftfsm.View) { _, err = scheduler.Place(v, req, f.cfg.Scheduler) })
	var nofit *scheduler.NoFitError
	return errors.As(err, &nofit) && nofit.Rejected[scheduler.FilterTenantShare] > 0
}

// poolLimited reports whether, on this node's state, req fits no host and
// its tenant's pools kept some host out, and names the pools. Like
// shareLimited, it reads a state at least as new as the refusal's.
func (f *Fleet) poolLimited(req scheduler.Request) (string, bool) {
	if req.Pools == nil {
		return "", false
	}
	var err error
	f.node.Read(func(v raftfsm.View) { _, err = scheduler.Place(v, req, f.cfg.Scheduler) })
	var nofit *scheduler.NoFitError
	if !errors.As(err, &nofit) || nofit.Rejected[scheduler.FilterPool] == 0 || nofit.Rejected[scheduler.FilterTenantShare] > 0 {
		return "", false
	}
	return scheduler.PoolNames(req.Pools), true
}

// checkHost refuses, and releases, a real model's placement on a host that
// runs the process runtime, unless the unsafe override is set.
func (f *Fleet) checkHost(ctx context.Context, p scheduler.Placement) error {
	var runtimes []string
	f.node.Read(func(v raftfsm.View) {
		if h, ok := v.Host(p.HostID); ok {
			runtimes = h.Runtimes
		}
	})
	refused := admission.CheckProcessHost(f.cfg.RealModel, f.cfg.AllowProcess, p.HostID, runtimes)
	if refused == nil {
		return nil
	}
	if _, err := f.Release(ctx, p.SessionID); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("releasing a placement on process host %s: %w", p.HostID, err)
	}
	return refused
}

// usable reports whether tool calls may go to a placement's sandbox at
// now: its host reported it ready, the host is up (addr is known), it is
// not paused and no mover holds it.
func usable(p scheduler.Placement, addr string, now time.Time) bool {
	return p.Ready && addr != "" && !p.Paused() && !p.Fence.Holds(now)
}

// waitUsable waits until the session's sandbox is ready and not fenced,
// woken by this node's state changes (and by a fence's end), and returns
// its placement and host address. A session whose placement goes away
// meanwhile is errdefs.NotFound.
func (f *Fleet) waitUsable(ctx context.Context, sessionID string) (scheduler.Placement, string, error) {
	for {
		changed := f.node.Changed()
		p, addr, ok := f.placement(sessionID)
		now := f.cfg.Now()
		switch {
		case !ok:
			return p, "", errdefs.NotFound("session %s has no sandbox any more", sessionID)
		case usable(p, addr, now):
			return p, addr, nil
		case p.Paused() && addr != "" && !p.Fence.Holds(now):
			if err := f.resume(ctx, p); err != nil {
				return p, "", err
			}
			continue
		}
		var until time.Time // a fence's end wakes the wait too
		if p.Fence.Holds(now) {
			until = p.Fence.Until
		}
		if err := waitChange(ctx, changed, until); err != nil {
			what := "ready"
			if !until.IsZero() {
				what = "moved (fenced until " + until.Format(time.RFC3339) + ")"
			}
			return p, "", errdefs.Wrap(errdefs.KindOf(ctx.Err()), ctx.Err(), "waiting for the sandbox of session %s on host %s to be %s", sessionID, p.HostID, what)
		}
	}
}

// waitChange waits until changed is closed, until passes (when set) or ctx
// ends, which is its error.
func waitChange(ctx context.Context, changed <-chan struct{}, until time.Time) error {
	var lapse <-chan time.Time
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		lapse = t.C
	}
	select {
	case <-changed:
	case <-lapse:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// known reports whether p is the placement this node's last tool call of
// the session found (so no replacement needs telling).
func (f *Fleet) known(sessionID string, p scheduler.Placement) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev, ok := f.used[sessionID]
	return ok && prev.HostID == p.HostID && prev.SandboxID == p.SandboxID
}

// lost records the placement a session's tool call uses and reports
// whether it replaces one whose host went down, or else how a drain moved
// it there (scheduler.Placement.Moved; "" for neither).
func (f *Fleet) lost(sessionID string, p scheduler.Placement) (lost bool, moved string) {
	f.mu.Lock()
	prev, ok := f.used[sessionID]
	f.used[sessionID] = p
	f.mu.Unlock()
	if !ok || prev.HostID == p.HostID && prev.SandboxID == p.SandboxID {
		return false, ""
	}
	down := false
	f.node.Read(func(v raftfsm.View) {
		h, ok := v.Host(prev.HostID)
		down = !ok || h.Status == scheduler.StatusDown
	})
	return down, p.Moved
}

// forget drops what this node keeps of a session.
func (f *Fleet) forget(sessionID string) {
	f.SessionRunning(sessionID) // stops its idle timer
	f.mu.Lock()
	delete(f.used, sessionID)
	delete(f.mounted, sessionID)
	f.mu.Unlock()
	f.cfg.Forget(sessionID)
}

// sandbox is a session's sandbox on its host, as the tools use it.
type sandbox struct {
	f         *Fleet
	sessionID string
	// hostID and client: where the sandbox was when last looked up; a call
	// that meets a fence looks again.
	hostID string
	client pb.SandboxServiceClient
	// memory: the read_write stores this call's mount showed, as it
	// showed them (the base of the step's changes: memorycommit.go).
	memory []MemoryMount
	// env is added to every command's environment: the placeholders of
	// the session's credentials and the egress CA bundle's variables
	// (mounts.go).
	env map[string]string
	// egressNote, when set, tells the model why the session's credentials
	// are not there (AfterStep adds it to the tool result).
	egressNote string
}

var _ tools.Sandbox = (*sandbox)(nil)

// call runs one SandboxService call. A call the host refused because a
// mover fenced the sandbox (it did not run) runs again where the sandbox
// is once the move is over. An idempotent call whose connection broke (the
// host agent restarted, say) runs again once the host is back, as long as
// the sandbox stays on it: an Exec with an execution id attaches to the
// command or gets its stored result, and never runs it twice.
//
// A host that answers Unavailable itself, over a connection that stayed
// up (its containerd is down, say), is asked again a few times with a
// growing pause, since no signal tells when it recovers.
func (s *sandbox) call(ctx context.Context, what string, idempotent bool, rpc func(ctx context.Context, c pb.SandboxServiceClient) error) error {
	until := time.Now().Add(s.f.cfg.ReadyTimeout)
	answered := 0 // Unavailable answers over a live connection
	for {
		err := errgrpc.FromStatus(rpc(ctx, s.client))
		if err == nil || ctx.Err() != nil {
			return err
		}
		rctx, cancel := context.WithDeadline(ctx, until)
		switch {
		case errdefs.KindOf(err) == errdefs.ConflictKind: // fenced
			err = s.rebind(rctx)
		case errdefs.IsNotFound(err) && s.movedAway(rctx):
			// The sandbox was moved away from this handle's host between
			// calls: the call found nothing there and ran nowhere.
			err = s.rebind(rctx)
		case errdefs.KindOf(err) == errdefs.UnavailableKind && idempotent:
			var waited bool
			if waited, err = s.reconnect(rctx, err); err == nil && !waited {
				if answered++; answered > maxHostRetries {
					err = errdefs.Wrap(errdefs.UnavailableKind, err, "host %s is unavailable", s.hostID)
					break
				}
				err = pause(rctx, time.Duration(100<<answered)*time.Millisecond)
			}
		default:
			cancel()
			return fmt.Errorf("%s: %w", what, err)
		}
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
}

// maxHostRetries bounds the calls repeated to a host that answers
// Unavailable over a live connection.
const maxHostRetries = 3

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// moveApplyWait bounds how long a call that found no sandbox on its host
// waits for this node to learn that the sandbox moved: the mover removes
// the source once the move is committed, and this node, a follower, may
// apply the commit after the host has answered.
const moveApplyWait = 2 * time.Second

// movedAway reports whether the session's sandbox moved away from the
// handle's host (moved), waiting up to moveApplyWait, on this node's state
// changes, for the move to show.
func (s *sandbox) movedAway(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, moveApplyWait)
	defer cancel()
	for {
		changed := s.f.node.Changed()
		if s.moved() {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// moved reports whether the session's sandbox is on another host than the
// handle's, which is still up (a move; a host lost is not one).
func (s *sandbox) moved() bool {
	var moved bool
	s.f.node.Read(func(v raftfsm.View) {
		p, ok := v.Placement(s.sessionID)
		old, hok := v.Host(s.hostID)
		moved = ok && p.HostID != s.hostID && hok && old.Status != scheduler.StatusDown
	})
	return moved
}

// rebind waits until the sandbox is usable again after a move and points
// the handle at its host.
func (s *sandbox) rebind(ctx context.Context) error {
	p, addr, err := s.f.waitUsable(ctx, s.sessionID)
	if err != nil {
		return err
	}
	c, err := s.f.client(p.HostID, addr)
	if err != nil {
		return err
	}
	s.hostID, s.client = p.HostID, c
	return nil
}

// reconnect waits until the connection to the sandbox's host is up again
// (woken by its state changes), failing if the sandbox left the host.
// waited says whether the connection was down at all.
func (s *sandbox) reconnect(ctx context.Context, cause error) (waited bool, err error) {
	for {
		p, _, ok := s.f.placement(s.sessionID)
		if !ok || p.HostID != s.hostID {
			return waited, errdefs.Wrap(errdefs.FailedPreconditionKind, cause, "the session's sandbox left host %s while a call to it was in flight (its host was lost or it was evicted); the call's outcome is unknown", s.hostID)
		}
		s.f.mu.Lock()
		c := s.f.conns[s.hostID]
		s.f.mu.Unlock()
		if c == nil {
			return waited, cause
		}
		c.cc.Connect()
		st := c.cc.GetState()
		if st == connectivity.Ready {
			return waited, nil
		}
		waited = true
		if !c.cc.WaitForStateChange(ctx, st) {
			return waited, errdefs.Wrap(errdefs.UnavailableKind, cause, "host %s did not come back", s.hostID)
		}
	}
}

// Exec implements tools.Sandbox. Only the result travels (the host keeps
// its head and tail of the output); a command with an execution id is
// killed when ctx ends, unless the session is handed to its next runner,
// which attaches to it.
func (s *sandbox) Exec(ctx context.Context, req tools.ExecRequest) (tools.ExecResult, error) {
	preq := &pb.ExecRequest{Key: s.sessionID, Command: req.Command, Dir: req.Dir, Stdin: req.Stdin, Env: s.env,
		MaxOutputBytes: int64(req.MaxOutput), ExecutionId: req.ExecutionID, ResultOnly: true}
	if req.Timeout > 0 {
		preq.Timeout = durationpb.New(req.Timeout)
	}
	s.f.markChanged(s.sessionID)
	defer s.f.snapshotWhile(ctx, s.sessionID)()
	if req.ExecutionID != "" {
		defer func() {
			if ctx.Err() == nil || errors.Is(context.Cause(ctx), agentloop.ErrHandOver) {
				return
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = s.CancelExec(cctx, req.ExecutionID)
		}()
	}
	var res *pb.ExecResult
	err := s.call(ctx, "exec", req.ExecutionID != "", func(ctx context.Context, c pb.SandboxServiceClient) error {
		st, err := c.Exec(ctx, preq)
		if err != nil {
			return err
		}
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return errdefs.Unavailable("exec in the sandbox of session %s: the stream ended without a result", s.sessionID)
			}
			if err != nil {
				return err
			}
			if res = m.GetResult(); res != nil {
				// The host sends nothing after the result: reading the
				// stream's end finishes the call now (its trailer read,
				// its span ended) instead of when ctx ends.
				_, _ = st.Recv()
				return nil
			}
		}
	})
	if err != nil {
		return tools.ExecResult{}, err
	}
	return tools.ExecResult{ExitCode: int(res.ExitCode), TimedOut: res.TimedOut, Truncated: res.Truncated, Stdout: res.Stdout, Stderr: res.Stderr, Lost: res.Lost}, nil
}

// CancelExec kills the running command of that execution id, if any.
func (s *sandbox) CancelExec(ctx context.Context, executionID string) error {
	return s.call(ctx, "canceling "+executionID, true, func(ctx context.Context, c pb.SandboxServiceClient) error {
		_, err := c.CancelExec(ctx, &pb.CancelExecRequest{Key: s.sessionID, ExecutionId: executionID})
		return err
	})
}

// ReadFile implements tools.Sandbox. The host refuses a file over the file
// tools' limit from its size, before reading it.
func (s *sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var data []byte
	err := s.call(ctx, "reading "+path, true, func(ctx context.Context, c pb.SandboxServiceClient) error {
		resp, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: s.sessionID, Path: path, MaxBytes: tools.MaxFileBytes})
		data = resp.GetData()
		return err
	})
	return data, err
}

// WriteFile implements tools.Sandbox. Writing the same bytes again is
// harmless, so a broken call is repeated.
func (s *sandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	s.f.markChanged(s.sessionID)
	return s.call(ctx, "writing "+path, true, func(ctx context.Context, c pb.SandboxServiceClient) error {
		_, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: s.sessionID, Path: path, Data: data, Mode: uint32(mode.Perm())})
		return err
	})
}

// ListFiles implements tools.Sandbox.
func (s *sandbox) ListFiles(ctx context.Context, dir string) ([]tools.FileInfo, error) {
	var files []*pb.FileInfo
	err := s.call(ctx, "listing "+dir, true, func(ctx context.Context, c pb.SandboxServiceClient) error {
		resp, err := c.ListFiles(ctx, &pb.ListFilesRequest{Key: s.sessionID, Dir: dir})
		files = resp.GetFiles()
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]tools.FileInfo, 0, len(files))
	for _, f := range files {
		out = append(out, tools.FileInfo{Path: f.Path, Size: f.Size, Mode: fs.FileMode(f.Mode), ModTime: f.ModTime.AsTime()})
	}
	return out, nil
}
