package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/envbuild"
	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/tools"
	"corral.dev/corral/internal/allowlist"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// DefaultSandboxImage is the image sandboxes run unless configured.
const DefaultSandboxImage = "localhost/corral/debian:bookworm-2"

// RescheduledEvent is the system event appended to a session whose sandbox
// was placed anew after its host was lost (reason host_lost), or moved off
// a drained host (reason host_drained, with moved: live, workspace or
// without_workspace).
const RescheduledEvent = "session.status_rescheduled"

// validateFleet fills the fleet's defaults and refuses a real model with
// the process runtime unless the unsafe override is set.
func (c *Config) validateFleet() error {
	if c.HostAddr == "" {
		c.HostAddr = "127.0.0.1:8443"
	}
	if c.BlobDir == "" {
		c.BlobDir = filepath.Join(c.DataDir, "blobs")
	}
	if c.SandboxRuntime == "" {
		c.SandboxRuntime = admission.RuntimeGVisor
	}
	if c.SandboxImage == "" {
		c.SandboxImage = DefaultSandboxImage
	}
	if c.SandboxReadyTimeout == 0 {
		c.SandboxReadyTimeout = 2 * time.Minute
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 5 * time.Second
	}
	if err := admission.CheckRuntime(c.SandboxRuntime); err != nil {
		return err
	}
	if c.HostHeartbeatInterval < 0 || c.HostTTL < 0 || c.SandboxReadyTimeout < 0 || c.SweepInterval < 0 {
		return errdefs.InvalidArgument("fleet intervals must not be negative")
	}
	return admission.CheckProcessRuntime(c.Model, c.SandboxRuntime, c.UnsafeAllowProcessRuntimeWithRealModel)
}

// startFleet builds the host service over the Raft node (hosts join, send
// heartbeats and get their assignments through it), the sessions'
// sandboxes over both, and the built-in tools over the sandboxes.
func (s *Server) startFleet(ctx context.Context) error {
	c := s.cfg
	blobs := c.Blobs
	if blobs == nil {
		d, err := blob.NewDir(c.BlobDir)
		if err != nil {
			return err
		}
		blobs = d
	}
	s.blobs = blobs
	s.egress = newEgressSink(s.store, s.log)
	svc, err := hosts.New(ctx, hosts.Config{
		Node:              s.raft,
		Advertise:         c.HostAdvertise,
		HeartbeatInterval: c.HostHeartbeatInterval,
		HostTTL:           c.HostTTL,
		Overcommit:        scheduler.OvercommitFromPolicy(s.policy.Overcommit),
		OnHostDown:        func(ctx context.Context, hostID string) { s.fleet.Reschedule(ctx, hostID) },
		OnEvicted:         func(ctx context.Context, hostID, sessionID string) { s.fleet.ReleaseEvicted(ctx, hostID, sessionID) },
		OnEgress:          s.egress.add,
		// A record a host sends for a session not placed on it, or
		// under another tenant, is rejected (hosts/egress.go).
		ObserveEgressRejected: s.metrics.observeEgressRejected,
		Logger:                s.log,
	})
	if err != nil {
		return fmt.Errorf("host service: %w", err)
	}
	s.hosts = svc
	prof, ok := s.policy.Runtimes[c.SandboxRuntime]
	if !ok {
		return errdefs.InvalidArgument("the policy has no profile for sandbox runtime %s (runtimes.yaml): its limits would be unknown", c.SandboxRuntime)
	}
	if cl, ok := s.policy.SandboxClasses[c.SandboxRuntime]; !ok || cl.Runtime != c.SandboxRuntime {
		return errdefs.InvalidArgument("the policy has no sandbox class %s of runtime %s (classes.yaml): it is the default class of a node with --sandbox-runtime %s", c.SandboxRuntime, c.SandboxRuntime, c.SandboxRuntime)
	}
	if err := checkClassProfiles(s.policy, c.SandboxRuntime); err != nil {
		return err
	}
	s.exec = execLimits(prof)
	pol := s.policy
	s.classes = classes{pol: pol, nodeDefault: c.SandboxRuntime, image: c.SandboxImage, st: s.store}
	if s.mirrors, err = envbuild.ParseMirrors(c.PackageMirrors); err != nil {
		return errdefs.Wrap(errdefs.InvalidArgumentKind, err, "package mirrors")
	}
	var builds fleet.Builds
	buildReq, gvisor := buildRequest(pol, c.SandboxImage)
	switch {
	case len(s.mirrors) > 0 && !gvisor:
		return errdefs.InvalidArgument("--package-mirror: environment packages are built in gVisor sandboxes, and the policy has no gvisor class (classes.yaml)")
	case len(s.mirrors) > 0:
		builds = buildRecords{s.store}
	}
	s.fleet, err = fleet.New(fleet.Config{
		Builds:              builds,
		BuildRequest:        buildReq,
		BuildRetention:      c.BuildRetention,
		Cluster:             s.raft,
		Credentials:         svc.SandboxCredentials,
		Request:             request(c.SandboxRuntime, c.SandboxImage, prof),
		Classes:             s.classes,
		RealModel:           c.Model != "fake",
		AllowProcess:        c.UnsafeAllowProcessRuntimeWithRealModel,
		Placement:           pol.PlacementOf,
		ReadyTimeout:        c.SandboxReadyTimeout,
		PauseAfterIdle:      pauseAfterIdle(c.PauseAfterIdle, prof),
		ArchiveReleaseAfter: archiveReleaseAfter(c.ArchiveReleaseAfter, prof),
		SweepInterval:       c.SweepInterval,
		Blobs:               blobs,
		Snapshots:           snapshotRecords{s.store},
		Sessions:            sessionRecords{s.store},
		AllowedHosts:        allowedHosts{st: s.store, pol: s.policy, mirrors: s.mirrors}.of,
		Notices:             notices{s.store},
		Mounts:              mountRecords{st: s.store, ring: s.raft.Keyring(), quota: s.fileQuota},
		Forget:              func(id string) { s.tools.Forget(id) },
		ObservePlace:        s.metrics.observePlace,
		DialOptions:         s.tracing.DialOptions(),
		Logger:              s.log,
	})
	if err != nil {
		return err
	}
	s.tools = tools.NewToolset(s.fleet.SandboxFor, s.exec)
	s.hosts.Serve(s.hostLn)
	return nil
}

// request is the placement request template for a runtime's sandboxes:
// the profile's requests, which the scheduler reserves, and its limits,
// which the placement carries to the host that applies them (disk has no
// request apart: the workspace's image is really its limit's size). The
// process runtime's profile sets no pids or disk limit, since that
// runtime can enforce none.
func request(runtime, image string, prof policy.Runtime) scheduler.Request {
	r := scheduler.Request{Runtime: runtime, Image: image, Pids: int64(prof.Pids),
		Resources: scheduler.Resources{CPUMillis: int64(prof.CPURequest()), MemoryMiB: int64(prof.MemoryRequest()), DiskMiB: int64(prof.DiskMiB)},
		Limits:    scheduler.Resources{CPUMillis: int64(prof.CPUMillis), MemoryMiB: int64(prof.MemoryMiB), DiskMiB: int64(prof.DiskMiB)}}
	if runtime == admission.RuntimeProcess {
		r.Image = "" // the process runtime runs no image
	}
	return r
}

// checkClassProfiles refuses classes whose runtime profile sets a
// session-wide limit other than the node's default runtime: the bash
// tool's exec limits (told to the model once per node), the archive
// retention and, for gVisor, the idle pause are applied per node, not per
// class, so a class that said otherwise would not get it.
func checkClassProfiles(pol *policy.Policy, nodeRuntime string) error {
	node := pol.Runtimes[nodeRuntime]
	for _, name := range slices.Sorted(maps.Keys(pol.SandboxClasses)) {
		cl := pol.SandboxClasses[name]
		rt := pol.Runtimes[cl.Runtime]
		same := rt.DefaultExecTimeoutSeconds == node.DefaultExecTimeoutSeconds && rt.ExecTimeoutSeconds == node.ExecTimeoutSeconds &&
			rt.OutputLimitBytes == node.OutputLimitBytes && rt.ArchiveReleaseAfter() == node.ArchiveReleaseAfter() &&
			(cl.Runtime != admission.RuntimeGVisor || rt.PauseAfterIdleSeconds == node.PauseAfterIdleSeconds)
		if !same {
			return errdefs.InvalidArgument("sandbox class %s: runtime %s's exec limits, archive_release_after_seconds or pause_after_idle_seconds differ from those of runtime %s, this node's --sandbox-runtime; they apply per node, not per class, so make them equal in runtimes.yaml", name, cl.Runtime, nodeRuntime)
		}
	}
	return nil
}

// admitSession is the public API's admission of a new session: the fleet's,
// told whether the session's agent uses the sandbox tools (only then must
// some host offer its class).
func (s *Server) admitSession(ctx context.Context, class string, agent json.RawMessage) (string, error) {
	var a agentloop.Agent
	if err := json.Unmarshal(agent, &a); err != nil {
		return "", fmt.Errorf("the new session's agent snapshot: %w", err)
	}
	return s.fleet.AdmitSession(ctx, class, a.NeedsSandbox())
}

// classes is fleet.Classes over the policy and the session records. The
// node's default class is the one named after its --sandbox-runtime, and
// a class without an image runs the node's --sandbox-image.
type classes struct {
	pol         *policy.Policy
	nodeDefault string
	image       string
	st          *store.Store
}

var _ fleet.Classes = classes{}

// maxClassName bounds the class name an error repeats back (a class name
// is at most 63 bytes; anything longer names none).
const maxClassName = 63

// Resolve implements fleet.Classes.
func (c classes) Resolve(tenantID, name string) (fleet.Class, error) {
	if name == "" {
		name = c.pol.TenantDefaultClass(tenantID, c.nodeDefault)
	}
	cl, prof, ok := c.pol.ClassProfile(name)
	if !ok {
		if len(name) > maxClassName {
			name = name[:maxClassName] + "..."
		}
		return fleet.Class{}, errdefs.InvalidArgument("unknown sandbox class %q: the classes this tenant may use are %s", name, strings.Join(c.usable(tenantID), ", "))
	}
	if !c.pol.TenantMayUseClass(tenantID, name, c.nodeDefault) {
		return fleet.Class{}, errdefs.PermissionDenied("sandbox class %s is not one this tenant may use (it may use %s): ask the operator to allow it (policy/classes.yaml tenant_classes; a class of a trusted_only runtime needs the tenant's trusted_runtimes too)", name, strings.Join(c.usable(tenantID), ", "))
	}
	r := request(cl.Runtime, cmp.Or(cl.Image, c.image), prof)
	r.Provider = cl.Provider()
	return fleet.Class{Name: name, Request: r, NoNetwork: !cl.AllowsNetwork(policy.NetworkLimited)}, nil
}

// usable lists the classes the tenant may use, sorted.
func (c classes) usable(tenantID string) []string {
	var out []string
	for name := range c.pol.SandboxClasses {
		if c.pol.TenantMayUseClass(tenantID, name, c.nodeDefault) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// OfSession implements fleet.Classes.
func (c classes) OfSession(ctx context.Context, sessionID string) (string, error) {
	sess, err := c.st.Sessions().Get(ctx, sessionID)
	if err != nil {
		return "", err
	}
	return sess.SandboxClass, nil
}

// execLimits are a profile's limits of the bash tool.
func execLimits(prof policy.Runtime) agentloop.ExecLimits {
	return agentloop.ExecLimits{
		DefaultTimeout: time.Duration(prof.DefaultExecTimeoutSeconds) * time.Second,
		MaxTimeout:     time.Duration(prof.ExecTimeoutSeconds) * time.Second,
		MaxOutputBytes: prof.OutputLimitBytes,
	}
}

// sessionRecords is fleet.Sessions over the store.
type sessionRecords struct{ st *store.Store }

var _ fleet.Sessions = sessionRecords{}

// Existing implements fleet.Sessions.
func (r sessionRecords) Existing(ctx context.Context, ids []string) (map[string]bool, error) {
	return r.st.ExistingSessions(ctx, ids)
}

// Archived implements fleet.Sessions.
func (r sessionRecords) Archived(ctx context.Context, ids []string) (map[string]time.Time, error) {
	return r.st.ArchivedSessions(ctx, ids)
}

// NeedsSandbox implements fleet.Sessions: whether the agent snapshot the
// session runs uses the sandbox tools. A self-hosted session's run on its
// worker, never in a sandbox.
func (r sessionRecords) NeedsSandbox(ctx context.Context, sessionID string) (bool, error) {
	sess, err := r.st.Sessions().Get(ctx, sessionID)
	if err != nil || sess.SelfHosted {
		return false, err
	}
	var a agentloop.Agent
	if err := json.Unmarshal(sess.Agent, &a); err != nil {
		return false, fmt.Errorf("session %s agent snapshot: %w", sessionID, err)
	}
	return a.NeedsSandbox(), nil
}

// allowedHosts is fleet.Config.AllowedHosts: the egress allowlist of the
// session's environment, read as the public API reports it
// (publicapi.SandboxAllowedHosts). A self-hosted session, or one whose
// environment is gone, gets none: no network. Unrestricted networking
// needs the tenant's grant now, at placement: a tenant that lost it keeps
// the sandboxes it has, and a new one is refused (the tool call says why).
type allowedHosts struct {
	st      *store.Store
	pol     *policy.Policy
	mirrors envbuild.Mirrors
}

func (a allowedHosts) of(ctx context.Context, sessionID string) ([]string, error) {
	sess, err := a.st.Sessions().Get(ctx, sessionID)
	if err != nil || sess.SelfHosted {
		return nil, err
	}
	env, err := a.st.Environments().Get(ctx, sess.EnvironmentID)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	hosts := publicapi.SandboxAllowedHosts(env.Config)
	if publicapi.Unrestricted(hosts) {
		if id, ok := tenant.From(ctx); !ok || !a.pol.GrantsUnrestrictedNetworking(string(id)) {
			return nil, publicapi.ErrUnrestrictedRevoked
		}
		return hosts, nil
	}
	if publicapi.SandboxAllowsPackageManagers(env.Config) {
		// The mirrors as they are now: an operator who removed one
		// removed it from every new sandbox.
		hosts = withHosts(hosts, a.mirrors.Hosts())
	}
	if publicapi.SandboxAllowsMCPServers(env.Config) {
		hosts = withHosts(hosts, mcpServerHosts(sess.Agent))
	}
	if _, err := allowlist.Parse(hosts); err != nil {
		return nil, errdefs.FailedPrecondition("this session's sandbox would be allowed too many hosts (its environment's allowed_hosts with its package mirrors and MCP servers): %v", err)
	}
	return hosts, nil
}

// snapshotRecords is fleet.Snapshots over the store.
type snapshotRecords struct{ st *store.Store }

var _ fleet.Snapshots = snapshotRecords{}

// List implements fleet.Snapshots.
func (r snapshotRecords) List(ctx context.Context, sessionID string) ([]fleet.Snapshot, error) {
	rows, err := r.st.Snapshots().List(ctx, sessionID)
	out := make([]fleet.Snapshot, 0, len(rows))
	for _, w := range rows {
		out = append(out, fleet.Snapshot{Seq: w.Seq, BlobKey: w.BlobKey, Full: w.Full, Origin: w.Origin, HostID: w.HostID, SandboxID: w.SandboxID,
			TakenAt: w.TakenAt, Files: w.Files, Bytes: w.Bytes, CreatedAt: w.CreatedAt})
	}
	return out, err
}

// Add implements fleet.Snapshots.
func (r snapshotRecords) Add(ctx context.Context, sessionID string, w fleet.Snapshot) error {
	return r.st.Snapshots().Add(ctx, store.WorkspaceSnapshot{SessionID: sessionID, Seq: w.Seq, BlobKey: w.BlobKey, Full: w.Full, Origin: w.Origin,
		HostID: w.HostID, SandboxID: w.SandboxID, TakenAt: w.TakenAt, Files: w.Files, Bytes: w.Bytes})
}

// DropBefore implements fleet.Snapshots.
func (r snapshotRecords) DropBefore(ctx context.Context, sessionID string, seq int64) error {
	return r.st.Snapshots().DropBefore(ctx, sessionID, seq)
}

// notices is fleet.Notices over the session's event log.
type notices struct{ st *store.Store }

var _ fleet.Notices = notices{}

// Rescheduled implements fleet.Notices: a session.status_rescheduled event.
func (n notices) Rescheduled(ctx context.Context, t tenant.ID, sessionID, from, to string) error {
	o := agentloop.Out{ID: store.NewEventID(), Type: RescheduledEvent, Fields: map[string]any{
		"reason": "host_lost", "from_host": from, "to_host": to,
	}}
	body, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	_, err = n.st.Events().Append(tenant.With(ctx, t), sessionID,
		store.Append{Events: []store.NewEvent{{ID: o.ID, Type: o.Type, Body: body}}})
	return err
}

// Moved implements fleet.Notices: a session.status_rescheduled event with
// reason host_drained and how the sandbox moved.
func (n notices) Moved(ctx context.Context, t tenant.ID, sessionID, from, to, how string) error {
	o := agentloop.Out{ID: store.NewEventID(), Type: RescheduledEvent, Fields: map[string]any{
		"reason": "host_drained", "from_host": from, "to_host": to, "moved": how,
	}}
	body, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	_, err = n.st.Events().Append(tenant.With(ctx, t), sessionID,
		store.Append{Events: []store.NewEvent{{ID: o.ID, Type: o.Type, Body: body}}})
	return err
}

// pauseAfterIdle is how long a session idles before its sandbox is paused:
// the profile's pause_after_idle_seconds unless the configuration sets
// one (negative: never).
func pauseAfterIdle(override time.Duration, prof policy.Runtime) time.Duration {
	switch {
	case override < 0:
		return 0
	case override > 0:
		return override
	}
	return time.Duration(prof.PauseAfterIdleSeconds) * time.Second
}

// archiveReleaseAfter is how long an archived session's sandbox is kept
// before its release: the profile's archive_release_after_seconds unless
// the configuration sets one (negative: at once).
func archiveReleaseAfter(override time.Duration, prof policy.Runtime) time.Duration {
	switch {
	case override < 0:
		return 0
	case override > 0:
		return override
	}
	return prof.ArchiveReleaseAfter()
}

// idleNotifier tells the fleet when a session's runner commits it idle
// (its sandbox may be paused after the runtime's interval) or running.
type idleNotifier struct {
	agentloop.Store
	fleet *fleet.Fleet
	log   *slog.Logger
	newID func() string
}

// publishError is the session.error that tells a session its outputs
// were not all published at its idle, and false when they were: the
// client would otherwise find files missing with nothing to say why.
// The error's text is the tenant's kind (agentloop.TenantMessage); what
// was left out is the host's reasons, which name the session's own paths.
func publishError(left fleet.LeftOut, err error) (agentloop.ErrorInfo, bool) {
	switch {
	case err != nil:
		return agentloop.ErrorInfo{Type: "unknown_error", RetryStatus: "retrying",
			Message: "the session's outputs were not published (" + agentloop.TenantMessage(err) + "); they are published again at its next idle"}, true
	case left.Count > 0:
		what := fmt.Sprintf("%d entries under %s were", left.Count, tools.Outputs)
		if left.Count == 1 {
			what = fmt.Sprintf("1 entry under %s was", tools.Outputs)
		}
		msg := fmt.Sprintf("%s not published: %s", what, strings.Join(left.Reasons, "; "))
		if int64(len(left.Reasons)) < left.Count {
			msg += "; …"
		}
		return agentloop.ErrorInfo{Type: "unknown_error", RetryStatus: "terminal", Message: msg}, true
	}
	return agentloop.ErrorInfo{}, false
}

// beforeIdle is events with e before its session.status_idle (at the end
// when it has none).
func beforeIdle(events []agentloop.Out, e agentloop.Out) []agentloop.Out {
	i := slices.IndexFunc(events, func(o agentloop.Out) bool { return o.Type == agentloop.StatusIdle })
	if i < 0 {
		return append(events, e)
	}
	return slices.Insert(events, i, e)
}

func (n idleNotifier) Commit(ctx context.Context, sessionID string, c agentloop.Commit) error {
	if c.Status == "idle" {
		// Before the turn is seen to end: an idle session's files are in
		// its snapshot, and its outputs are in the Files API.
		n.fleet.SnapshotIfChanged(ctx, sessionID)
		left, err := n.fleet.PublishOutputs(ctx, sessionID)
		if err != nil {
			// The turn ends all the same; the next idle publishes again.
			n.log.Warn("publishing a session's outputs", "session_id", sessionID, "err", err)
		}
		if e, ok := publishError(left, err); ok {
			c.Events = beforeIdle(c.Events, agentloop.ErrorEvent(n.newID(), e))
		}
	}
	if err := n.Store.Commit(ctx, sessionID, c); err != nil {
		return err
	}
	switch c.Status {
	case "idle":
		n.fleet.SessionIdle(sessionID)
	case "running":
		n.fleet.SessionRunning(sessionID)
	}
	return nil
}
