package agent

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Pressure relief
//
// Before each heartbeat the agent asks Config.Pressure whether the host is
// short of memory or disk. While it is, the agent frees one sandbox at a
// time, asking again after each, until the pressure is gone or nothing is
// left to free:
//
//	1. a pooled (warm) sandbox is destroyed: a cache, it goes before any
//	   session's sandbox;
//	2. under memory pressure, an idle sandbox is paused, where the driver
//	   can pause (runsc checkpoint: its memory is freed, its processes and
//	   files are kept); the heartbeat reports the pause and the control
//	   plane records the placement paused, so that the session's next tool
//	   call resumes it as after an idle pause;
//	3. only when no idle sandbox is left to pause (the driver cannot pause,
//	   or each pause failed), or under disk pressure alone (a pause frees no
//	   disk: the checkpoint stays on it), an idle sandbox is evicted: its
//	   workspace is kept in the state dir until it is ensured again.
//
// Idle is ready, running (not paused), with no command in flight, not
// being paused or evicted and not fenced by a mover. Pausing and evicting
// take the idle sandboxes in one order (nextForRelief): the tenant with
// the most running idle sandboxes on the host first, so that one tenant's
// many idle sandboxes go before another tenant's only one; between tenants
// with as many, the one whose sandbox has been idle longest; within the
// tenant, the sandbox idle longest (least recently used) first. Ties fall
// to the smaller key. The count is taken again after each step.

// relievePressure frees sandboxes while the host reports pressure (see
// above) and returns the pressure conditions.
func (a *Agent) relievePressure(ctx context.Context) []*pb.Condition {
	now := timestamppb.New(a.cfg.Now())
	// An assignment in progress holds the lock: report pressure without
	// relieving it this time rather than hold up the heartbeat.
	relieve := a.reconcileMu.TryLock()
	if relieve {
		defer a.reconcileMu.Unlock()
	}
	// Sandboxes whose pause failed this time, or whose runtime's driver
	// never pauses (they are evicted instead, in their turn).
	unpausable := map[string]bool{}
	for {
		p, err := a.cfg.Pressure(ctx)
		if err != nil {
			msg := "checking pressure: " + err.Error()
			return []*pb.Condition{
				{Type: "memory_pressure", Ok: false, Message: msg, CheckedAt: now},
				{Type: "disk_pressure", Ok: false, Message: msg, CheckedAt: now},
			}
		}
		if relieve && (p.Memory || p.Disk) && a.relieveOne(ctx, p, unpausable) {
			continue
		}
		conds := []*pb.Condition{
			{Type: "memory_pressure", Ok: !p.Memory, CheckedAt: now},
			{Type: "disk_pressure", Ok: !p.Disk, CheckedAt: now},
		}
		for _, c := range conds {
			switch {
			case c.Ok:
			case relieve:
				c.Message = "under pressure and no idle sandbox left to pause or evict"
			default:
				c.Message = "under pressure; relief waits for the assignment in progress"
			}
		}
		return conds
	}
}

// relieveOne frees one sandbox under pressure p, in the order above, and
// reports whether it did. unpausable collects the sandboxes whose pause
// failed or whose driver cannot pause: on a host of several runtimes
// another's may, so one that cannot is no reason to evict the rest. The
// caller holds reconcileMu.
func (a *Agent) relieveOne(ctx context.Context, p Pressure, unpausable map[string]bool) bool {
	reason := "memory_pressure"
	if !p.Memory {
		reason = "disk_pressure"
	}
	if a.dropPooled(ctx, reason) {
		return true
	}
	for p.Memory {
		key := a.nextForRelief(unpausable)
		if key == "" {
			break
		}
		disk, err := a.pauseLocked(ctx, key)
		switch {
		case err == nil:
			a.notePressurePause(key, reason, disk)
			return true
		case errdefs.IsUnimplemented(err):
			unpausable[key] = true // its driver never pauses: evicted in its turn
		default:
			a.log.Warn("pausing an idle sandbox under memory pressure; it may be evicted instead", "session_id", key, "err", err)
			unpausable[key] = true
		}
	}
	key := a.nextForRelief(nil)
	if key == "" {
		return false
	}
	if err := a.evictLocked(ctx, key, reason); err != nil {
		// The sandbox is left as it was; the next heartbeat tries again.
		a.log.Error("evicting sandbox", "session_id", key, "err", err)
		return false
	}
	return true
}

// notePressurePause records, for the next heartbeat, that the agent paused
// key by itself.
func (a *Agent) notePressurePause(key, reason string, disk int64) {
	now := a.cfg.Now()
	a.mu.Lock()
	a.pressurePauses = append(a.pressurePauses, &pb.PressurePause{Key: key, Reason: reason, PausedAt: timestamppb.New(now), DiskBytes: disk})
	a.mu.Unlock()
	a.log.Warn("paused idle sandbox under pressure", "session_id", key, "reason", reason)
}

// nextForRelief returns the idle sandbox to pause or evict next (the
// order above), leaving out those in skip, or "".
func (a *Agent) nextForRelief(skip map[string]bool) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.cfg.Now()
	type tenantIdle struct {
		running int  // its idle running sandboxes, skipped ones included
		first   *box // its sandbox idle longest, of those not skipped
	}
	tenants := map[string]*tenantIdle{}
	for _, b := range a.boxes {
		if b.rec.State != sandbox.Ready || b.sb == nil || b.inflight > 0 || b.rec.Paused || b.pausing || b.evicting || now.Before(b.fencedUntil) {
			continue
		}
		t := tenants[b.rec.Tenant]
		if t == nil {
			t = &tenantIdle{}
			tenants[b.rec.Tenant] = t
		}
		t.running++
		if !skip[b.rec.Key] && (t.first == nil || idleLonger(b, t.first)) {
			t.first = b
		}
	}
	var pick *tenantIdle
	for _, t := range tenants {
		if t.first == nil {
			continue
		}
		if pick == nil || t.running > pick.running || t.running == pick.running && idleLonger(t.first, pick.first) {
			pick = t
		}
	}
	if pick == nil {
		return ""
	}
	return pick.first.rec.Key
}

// idleLonger reports whether x has been idle longer than y (used less
// recently; the smaller key on a tie).
func idleLonger(x, y *box) bool {
	if !x.rec.LastUsed.Equal(y.rec.LastUsed) {
		return x.rec.LastUsed.Before(y.rec.LastUsed)
	}
	return x.rec.Key < y.rec.Key
}
