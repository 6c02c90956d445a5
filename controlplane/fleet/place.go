package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// SessionIDPrefix starts every session id: the sweep only looks at
// placements whose keys are shaped like one (the admin API may place
// others).
const SessionIDPrefix = "sesn_"

func (f *Fleet) checkTrusted(t tenant.ID) error {
	granted := f.cfg.Trusted != nil && f.cfg.Trusted(string(t))
	return admission.CheckTrustedRuntime(string(t), f.cfg.Request.Runtime, f.cfg.TrustedOnly, granted)
}

// Admit refuses a turn (a user.message) of a session that has no sandbox
// yet and whose agent uses the sandbox tools while its tenant's sandboxes
// already fill its quota: the turn would need a sandbox it cannot get. The
// client gets 429 naming the quota instead of a session.error later.
// Placement checks the quota again at commit, in the FSM, so two turns
// racing past here still cannot exceed it; this is early refusal, not the
// enforcement.
func (f *Fleet) Admit(ctx context.Context, sessionID string) error {
	t, err := tenant.Required(ctx)
	if err != nil {
		return err
	}
	var full error
	f.node.Read(func(v raftfsm.View) {
		if _, placed := v.Placement(sessionID); placed {
			return
		}
		full = scheduler.CheckQuota(string(t), v.Usage(string(t)), v.Quota(string(t)), f.cfg.Request.Resources)
	})
	if full == nil {
		return nil
	}
	needs, err := f.cfg.Sessions.NeedsSandbox(ctx, sessionID)
	if err != nil || !needs {
		return nil // the append reports a missing session itself
	}
	return errdefs.Wrap(errdefs.ResourceExhaustedKind, full, "this session's tools need a sandbox; delete one of the tenant's sessions to free one")
}

// Place places a session's sandbox: it plans with the scheduler over this
// node's state and commits the plan through Raft, which plans again over
// its own state when the plan went stale, or when this node found no host
// (its state may lag the leader's: a host just registered). A session
// already placed gets its placement back.
func (f *Fleet) Place(ctx context.Context, req scheduler.Request) (_ scheduler.Placement, err error) {
	req = f.withPlacement(req)
	var (
		plan     scheduler.Plan
		existing scheduler.Placement
	)
	if f.cfg.ObservePlace != nil {
		start := time.Now()
		defer func() { f.cfg.ObservePlace(placeOutcome(plan.Existing, err), time.Since(start)) }()
	}
	cfg := f.cfg.Scheduler
	f.node.Read(func(v raftfsm.View) {
		if plan, err = scheduler.Place(v, req, cfg); err == nil && plan.Existing {
			existing, _ = v.Placement(req.SessionID)
		}
	})
	if scheduler.IsNoFit(err) {
		plan, err = scheduler.Plan{}, nil // the FSM plans
	}
	if err != nil || plan.Existing {
		return existing, err
	}
	return raftfsm.Apply(ctx, f.node, raftfsm.Place, raftfsm.Key("place/"+req.SessionID),
		raftfsm.PlacePayload{Plan: plan, Request: &req, Config: &cfg})
}

// placeOutcome names a Place's outcome for ObservePlace.
func placeOutcome(existing bool, err error) string {
	switch {
	case err == nil && existing:
		return "existing"
	case err == nil:
		return "placed"
	}
	switch errdefs.KindOf(err) {
	case errdefs.ResourceExhaustedKind:
		return "no_capacity"
	case errdefs.FailedPreconditionKind, errdefs.PermissionDeniedKind, errdefs.InvalidArgumentKind:
		return "refused"
	case errdefs.UnavailableKind:
		return "unavailable"
	case errdefs.CanceledKind, errdefs.DeadlineExceededKind:
		return "canceled"
	}
	return "error"
}

// withPlacement is r with its tenant's placement policy applied: the
// pools it may use, zone spread. Every request the fleet plans goes
// through it, the moves' too (drain, rescheduling after host loss), so no
// placement ever lands outside the tenant's pools.
func (f *Fleet) withPlacement(r scheduler.Request) scheduler.Request {
	if f.cfg.Placement != nil {
		r.ApplyPlacement(f.cfg.Placement(r.Tenant))
	}
	return r
}

// Release drops a session's placement through Raft (the leader then has
// its host destroy the sandbox) and returns it. It takes no fence: a
// deleted session's tool call may as well fail. A session without a
// placement is errdefs.NotFound.
func (f *Fleet) Release(ctx context.Context, sessionID string) (scheduler.Placement, error) {
	return raftfsm.Apply(ctx, f.node, raftfsm.Release, raftfsm.Key("release/"+sessionID), raftfsm.ReleasePayload{SessionID: sessionID})
}

// SessionDeleted releases a deleted session's sandbox and forgets it; the
// sweep retries what fails here.
func (f *Fleet) SessionDeleted(ctx context.Context, sessionID string) {
	f.forget(sessionID)
	f.dropSnapshots(ctx, sessionID)
	if _, err := f.Release(ctx, sessionID); err != nil && !errdefs.IsNotFound(err) {
		f.log.Warn("releasing a deleted session's sandbox (the sweep retries)", "session_id", sessionID, "err", err)
	}
}

// Sweep releases the placements of sessions that no longer exist: deleting
// a session releases its placement at once, and this repairs a release
// lost to a crash. It releases those of sessions archived past
// ArchiveReleaseAfter too (archive.go). Run calls it on the leader.
func (f *Fleet) Sweep(ctx context.Context) error {
	var ids []string
	f.node.Read(func(v raftfsm.View) {
		for _, p := range v.Placements() {
			if strings.HasPrefix(p.SessionID, SessionIDPrefix) {
				ids = append(ids, p.SessionID)
			}
		}
	})
	if len(ids) == 0 {
		return nil
	}
	exist, err := f.cfg.Sessions.Existing(ctx, ids)
	if err != nil {
		return err
	}
	var errs []error
	var live []string
	for _, id := range ids {
		if exist[id] {
			live = append(live, id)
			continue
		}
		if _, err := f.Release(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("session %s: %w", id, err))
			continue
		}
		f.forget(id)
		f.log.Info("released the sandbox of a deleted session", "session_id", id)
	}
	if err := f.sweepArchived(ctx, live); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DestroyTenantSandboxes releases each of a deleted tenant's placements
// (the hosts then destroy the sandboxes) and returns once none is left on
// this node's state. It takes no fences: a tool call still running on
// another node may as well fail.
func (f *Fleet) DestroyTenantSandboxes(ctx context.Context, id tenant.ID) error {
	for {
		changed := f.node.Changed()
		var ids []string
		f.node.Read(func(v raftfsm.View) {
			for _, p := range v.Placements() {
				if p.Tenant == string(id) {
					ids = append(ids, p.SessionID)
				}
			}
		})
		if len(ids) == 0 {
			return nil
		}
		released := 0
		for _, k := range ids {
			switch _, err := f.Release(ctx, k); {
			case err == nil:
				released++
			case !errdefs.IsNotFound(err):
				return fmt.Errorf("releasing the sandbox of session %s: %w", k, err)
			}
		}
		if released > 0 {
			continue
		}
		// Every one was gone already, while this node had not applied it:
		// wait for its state to move on.
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// SetSandboxQuota sets a tenant's sandbox limits in Raft, where placement
// enforces them (quota.SandboxQuotaSetter). A limit below the tenant's
// usage is refused with errdefs.FailedPrecondition.
func (f *Fleet) SetSandboxQuota(ctx context.Context, id tenant.ID, sandboxes, cpuMillis, memoryMiB int) error {
	_, err := raftfsm.Apply(ctx, f.node, raftfsm.SetQuota, raftfsm.Key("quota/"+string(id)), raftfsm.SetQuotaPayload{
		Tenant: string(id),
		Quota:  scheduler.Quota{ConcurrentSandboxes: sandboxes, CPUMillis: int64(cpuMillis), MemoryMiB: int64(memoryMiB)},
	})
	return err
}
