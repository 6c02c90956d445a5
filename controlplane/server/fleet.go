package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/hosts"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// DefaultSandboxImage is the image sandboxes run unless configured.
const DefaultSandboxImage = "localhost/corral/debian:bookworm-1"

// RescheduledEvent is the system event appended to a session whose sandbox
// was placed anew after its host was lost.
const RescheduledEvent = "session.status_rescheduled"

// The runtimes a session's sandbox can ask for.
const (
	RuntimeGVisor  = "gvisor"
	RuntimeRunc    = "runc"
	RuntimeProcess = "process"
)

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
		c.SandboxRuntime = RuntimeGVisor
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
	switch c.SandboxRuntime {
	case RuntimeGVisor, RuntimeRunc, RuntimeProcess:
	default:
		return errdefs.InvalidArgument("unknown sandbox runtime %q: want gvisor, runc or process", c.SandboxRuntime)
	}
	if c.HostHeartbeatInterval < 0 || c.HostTTL < 0 || c.SandboxReadyTimeout < 0 || c.SweepInterval < 0 {
		return errdefs.InvalidArgument("fleet intervals must not be negative")
	}
	return CheckProcessRuntime(c.Model, c.SandboxRuntime, c.UnsafeAllowProcessRuntimeWithRealModel)
}

// CheckProcessRuntime refuses a real model's tool calls (model is not
// "fake") in the process runtime, which isolates nothing, unless the unsafe
// override is set. Its error is errdefs.FailedPrecondition.
func CheckProcessRuntime(model, runtime string, override bool) error {
	if model == "fake" || model == "" || runtime != RuntimeProcess || override {
		return nil
	}
	return errdefs.FailedPrecondition("refusing to run a real model (%s) with the process runtime: its sandboxes isolate nothing, so the model's commands would run on the host as this user; use gvisor, or set --unsafe-allow-process-runtime-with-real-model if you accept that", model)
}

// startFleet builds the host service over the Raft node (hosts join, send
// heartbeats and get their assignments through it) and the sessions'
// sandboxes over it.
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
	svc, err := hosts.New(ctx, hosts.Config{
		Node:              s.raft,
		Advertise:         c.HostAdvertise,
		HeartbeatInterval: c.HostHeartbeatInterval,
		HostTTL:           c.HostTTL,
		Blobs:             blobs,
		OnRescheduled:     s.onRescheduled,
		Locker:            s.store,
		Logger:            s.log,
	})
	if err != nil {
		return fmt.Errorf("host service: %w", err)
	}
	s.hosts = svc
	s.hosts.Serve(s.hostLn)
	s.sandboxes = newSandboxes(s)
	return nil
}

// onRescheduled appends a session.status_rescheduled event to a session
// whose sandbox moved off a lost host.
func (s *Server) onRescheduled(ctx context.Context, tn, sessionKey, from, to string) {
	if !strings.HasPrefix(sessionKey, store.SessionIDPrefix) {
		return // placed through the admin API, not a session
	}
	o := agentloop.Out{ID: store.NewEventID(), Type: RescheduledEvent, Fields: map[string]any{
		"reason": "host_lost", "from_host": from, "to_host": to,
	}}
	body, err := o.MarshalJSON()
	if err == nil {
		_, err = s.store.Events().Append(tenant.With(ctx, tenant.ID(tn)), sessionKey,
			store.Append{Events: []store.NewEvent{{ID: o.ID, Type: o.Type, Body: body}}})
	}
	if err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("recording a rescheduled sandbox", "session_id", sessionKey, "err", err)
	}
}

// hostOps adapts hosts.Service to api.HostOps.
type hostOps struct{ svc *hosts.Service }

var _ api.HostOps = hostOps{}

// Drain implements api.HostOps.
func (h hostOps) Drain(ctx context.Context, hostID string, deadline time.Duration, progress func(moved, evicted, remaining int, msg string)) error {
	moved, evicted := 0, 0
	return h.svc.Drain(ctx, hostID, deadline, func(p hosts.DrainProgress) {
		switch p.State {
		case hosts.DrainMoved, hosts.DrainMovedWithoutWorkspace:
			moved++
		case hosts.DrainEvicted:
			evicted++
		}
		msg := fmt.Sprintf("%s: %s", p.SessionKey, p.State)
		if p.To != "" {
			msg += " to " + p.To
		}
		if p.Blob != "" {
			msg += ", workspace kept as " + p.Blob
		}
		if p.Err != nil {
			msg += ": " + p.Err.Error()
		}
		progress(moved, evicted, p.Total-p.Done, msg)
	})
}

// Evict implements api.HostOps.
func (h hostOps) Evict(ctx context.Context, sessionKey string) error {
	return h.svc.Evict(ctx, sessionKey)
}

// fleetQuota applies tenants' sandbox limits through Raft, where placement
// enforces them.
type fleetQuota struct{ node *raftfsm.Node }

var _ quota.SandboxQuotaSetter = fleetQuota{}

// SetSandboxQuota implements quota.SandboxQuotaSetter.
func (f fleetQuota) SetSandboxQuota(ctx context.Context, id tenant.ID, sandboxes, cpuMillis, memoryMiB int) error {
	p := raftfsm.SetQuotaPayload{Tenant: string(id), Quota: scheduler.Quota{
		ConcurrentSandboxes: sandboxes, CPUMillis: int64(cpuMillis), MemoryMiB: int64(memoryMiB)}}
	c, err := raftfsm.NewCommand(raftfsm.CmdSetQuota, raftfsm.Key("quota/"+string(id)), p)
	if err != nil {
		return err
	}
	_, err = f.node.Apply(ctx, c)
	return err
}

// reaper releases every placement of a deleted tenant.
type reaper struct{ node *raftfsm.Node }

var _ api.SandboxReaper = reaper{}

// DestroyTenantSandboxes implements api.SandboxReaper: it releases each of
// the tenant's placements (the hosts then destroy the sandboxes) and
// returns once none is left. It takes no session locks: a tool call still
// running on another node may as well fail.
func (r reaper) DestroyTenantSandboxes(ctx context.Context, id tenant.ID) error {
	for {
		var keys []string
		r.node.Read(func(v raftfsm.View) {
			for _, p := range v.Placements() {
				if p.Tenant == string(id) {
					keys = append(keys, p.SessionKey)
				}
			}
		})
		if len(keys) == 0 {
			return nil
		}
		for _, k := range keys {
			if err := release(ctx, r.node, k); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("releasing the sandbox of session %s: %w", k, err)
			}
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// sweep releases, while this node leads, the placements of sessions that no
// longer exist: deleting a session releases its placement at once, and this
// repairs a release lost to a crash. Only keys shaped like session ids are
// considered (the admin API may place others).
func (s *Server) sweep(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.raft.IsLeader() {
			continue
		}
		if err := s.sweepOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("releasing the sandboxes of deleted sessions", "err", err)
		}
	}
}

func (s *Server) sweepOnce(ctx context.Context) error {
	var keys []string
	s.raft.Read(func(v raftfsm.View) {
		for _, p := range v.Placements() {
			if strings.HasPrefix(p.SessionKey, store.SessionIDPrefix) {
				keys = append(keys, p.SessionKey)
			}
		}
	})
	exist, err := s.store.ExistingSessions(ctx, keys)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		if exist[k] {
			continue
		}
		if err := release(ctx, s.raft, k); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("session %s: %w", k, err))
			continue
		}
		s.sandboxes.forget(k)
		s.log.Info("released the sandbox of a deleted session", "session_id", k)
	}
	return errors.Join(errs...)
}

// release drops a session's placement through Raft; the leader then has
// its host destroy the sandbox. It takes no session lock: a deleted
// session's tool call may as well fail, and one that has run into a
// process host's refusal holds the lock itself.
func release(ctx context.Context, node *raftfsm.Node, sessionKey string) error {
	c, err := raftfsm.NewCommand(raftfsm.CmdRelease, raftfsm.Key("release/"+sessionKey), raftfsm.ReleasePayload{SessionKey: sessionKey})
	if err != nil {
		return err
	}
	_, err = node.Apply(ctx, c)
	return err
}

// sessionDeleted releases a deleted session's sandbox; the sweep retries
// what fails here.
// admitTurn is the events API's Admit (sandboxes.admit says what it refuses).
func (s *Server) admitTurn(ctx context.Context, sessionID string) error {
	return s.sandboxes.admit(ctx, sessionID)
}

func (s *Server) sessionDeleted(ctx context.Context, sessionID string) {
	s.sandboxes.forget(sessionID)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := release(ctx, s.raft, sessionID); err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("releasing a deleted session's sandbox (the sweep retries)", "session_id", sessionID, "err", err)
	}
}

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
