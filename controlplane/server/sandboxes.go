package server

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// replacedNotice starts the first tool result after a session's sandbox
// was lost and placed anew.
const replacedNotice = "Note: this session's sandbox was lost with its host and has been replaced by a new, empty one. Files written earlier in this session are gone, and the shell starts again in /workspace."

// sandboxes gives each session one sandbox on the fleet, placed on its
// first tool call and reused by later turns:
//
//	tool call ── lock (cluster-wide, per session) ── tools.Runner
//	    └── sandboxFor: Place (idempotent per session) ── refuse process
//	        with a real model ── WaitReady ── tools.Remote on its host
type sandboxes struct {
	store   *store.Store
	node    *raftfsm.Node
	hosts   *hosts.Service
	runner  *tools.Runner
	req     scheduler.Request // the template: runtime, image, resources
	timeout time.Duration
	// realModel and allowProcess: a real model's sessions are not placed on
	// process hosts unless allowProcess.
	realModel, allowProcess bool

	// mu guards used.
	mu sync.Mutex
	// used is the placement each session's last tool call ran in.
	used map[string]scheduler.Placement
}

func newSandboxes(s *Server) *sandboxes {
	c := s.cfg
	prof, ok := s.policy.Runtimes[c.SandboxRuntime]
	if !ok {
		prof = s.policy.Runtimes[RuntimeGVisor]
	}
	x := &sandboxes{
		store: s.store, node: s.raft, hosts: s.hosts, timeout: c.SandboxReadyTimeout,
		req:       request(c.SandboxRuntime, c.SandboxImage, prof),
		realModel: c.Model != "fake", allowProcess: c.UnsafeAllowProcessRuntimeWithRealModel,
		used: map[string]scheduler.Placement{},
	}
	x.runner = tools.NewRunner(x.sandboxFor)
	return x
}

// request is the placement request template for a runtime's sandboxes.
func request(runtime, image string, prof policy.Runtime) scheduler.Request {
	r := scheduler.Request{Runtime: runtime, Image: image,
		Resources: scheduler.Resources{CPUMillis: int64(prof.CPUMillis), MemoryMiB: int64(prof.MemoryMiB)}}
	if runtime == RuntimeProcess {
		r.Image = "" // the process runtime runs no image
	}
	return r
}

// Run implements agentloop.ToolRunner: the tool call runs under the
// session's sandbox lock, so a drain moves the sandbox between calls.
func (x *sandboxes) Run(ctx context.Context, sessionID string, call agentloop.ToolCall) (agentloop.ToolResult, error) {
	unlock, err := x.hosts.LockSandbox(ctx, sessionID)
	if err != nil {
		return agentloop.ToolResult{}, err
	}
	defer unlock()
	return x.runner.Run(ctx, sessionID, call)
}

// CancelTool implements agentloop.ToolCanceler: it stops a call of an
// interrupted turn wherever it runs. It takes no sandbox lock: the call
// being stopped may hold it, on this node or another.
func (x *sandboxes) CancelTool(ctx context.Context, sessionID string, call agentloop.ToolCall) error {
	return x.runner.CancelTool(ctx, sessionID, call)
}

var (
	_ agentloop.ToolRunner   = (*sandboxes)(nil)
	_ agentloop.ToolCanceler = (*sandboxes)(nil)
)

// sandboxFor places the session's sandbox if it has none, waits until it is
// usable and returns it. A sandbox placed anew after its host was lost is
// returned once as tools.Replaced.
func (x *sandboxes) sandboxFor(ctx context.Context, sessionID string) (tools.Sandbox, error) {
	t, err := tenant.Required(ctx)
	if err != nil {
		return nil, err
	}
	if x.req.Runtime == RuntimeProcess && x.realModel && !x.allowProcess {
		return nil, CheckProcessRuntime("a real model", RuntimeProcess, false)
	}
	req := x.req
	req.SessionKey, req.Tenant = sessionID, string(t)
	p, err := x.node.Place(ctx, req)
	if err != nil {
		if errdefs.KindOf(err) == errdefs.ResourceExhaustedKind {
			return nil, errdefs.Wrap(errdefs.ResourceExhaustedKind, err, "no sandbox capacity for this session (runtime %s)", req.Runtime)
		}
		return nil, fmt.Errorf("placing the session's sandbox: %w", err)
	}
	if err := x.checkHost(ctx, p); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, x.timeout)
	defer cancel()
	if p, err = x.hosts.WaitReady(wctx, sessionID); err != nil {
		return nil, fmt.Errorf("the session's sandbox did not become ready within %v: %w", x.timeout, err)
	}
	client, err := x.hosts.Sandbox(p.HostID)
	if err != nil {
		return nil, err
	}
	var sb tools.Sandbox = tools.Remote{Client: client, Key: sessionID}
	if x.lost(sessionID, p) {
		sb = tools.Replaced{Sandbox: sb, Notice: replacedNotice}
	}
	return sb, nil
}

// admit refuses a turn (a user.message) of a session that has no sandbox
// yet and whose agent uses the sandbox tools while its tenant's sandboxes
// already fill its quota: the turn would need a sandbox it cannot get. The
// client gets 429 naming the quota instead of a session.error later.
// Placement checks the quota again at commit, in the FSM, so two turns
// racing past here still cannot exceed it; this is early refusal, not the
// enforcement.
func (x *sandboxes) admit(ctx context.Context, sessionID string) error {
	t, err := tenant.Required(ctx)
	if err != nil {
		return err
	}
	var full error
	x.node.Read(func(v raftfsm.View) {
		if _, placed := v.Placement(sessionID); placed {
			return
		}
		full = scheduler.CheckQuota(string(t), v.Usage(string(t)), v.Quota(string(t)), x.req.Resources)
	})
	if full == nil {
		return nil
	}
	s, err := x.store.Sessions().Get(ctx, sessionID)
	if err != nil {
		return nil // the append reports a missing session itself
	}
	var a agentloop.Agent
	if json.Unmarshal(s.Agent, &a) != nil || !a.NeedsSandbox() {
		return nil
	}
	return errdefs.Wrap(errdefs.ResourceExhaustedKind, full, "this session's tools need a sandbox; delete one of the tenant's sessions to free one")
}

// checkHost refuses, and releases, a real model's placement on a host that
// runs the process runtime, unless the unsafe override is set.
func (x *sandboxes) checkHost(ctx context.Context, p scheduler.Placement) error {
	if !x.realModel || x.allowProcess {
		return nil
	}
	var process bool
	x.node.Read(func(v raftfsm.View) {
		if h, ok := v.Host(p.HostID); ok {
			process = slices.Contains(h.Runtimes, RuntimeProcess)
		}
	})
	if !process {
		return nil
	}
	if err := release(ctx, x.node, p.SessionKey); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("releasing a placement on process host %s: %w", p.HostID, err)
	}
	return errdefs.FailedPrecondition("refusing to place a real model's session on host %s, which runs the process runtime and isolates nothing (set --unsafe-allow-process-runtime-with-real-model to allow it)", p.HostID)
}

// lost records the placement a session's tool call uses and reports
// whether it replaces one whose host went down (a drained sandbox moves
// with its workspace and is not lost). It is kept in memory: a node that
// takes a session over does not know where its earlier calls ran.
func (x *sandboxes) lost(sessionID string, p scheduler.Placement) bool {
	x.mu.Lock()
	prev, ok := x.used[sessionID]
	x.used[sessionID] = p
	x.mu.Unlock()
	if !ok || prev.HostID == p.HostID && prev.SandboxID == p.SandboxID {
		return false
	}
	down := false
	x.node.Read(func(v raftfsm.View) {
		h, ok := v.Host(prev.HostID)
		down = !ok || h.Status == scheduler.StatusDown
	})
	return down
}

// forget drops what is kept for a deleted session.
func (x *sandboxes) forget(sessionID string) {
	x.mu.Lock()
	delete(x.used, sessionID)
	x.mu.Unlock()
	x.runner.Forget(sessionID)
}
