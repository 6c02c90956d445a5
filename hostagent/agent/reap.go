package agent

import (
	"context"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/sandbox"
)

// orphanFinder is a driver that can see sandboxes no host agent can reach
// any more and remove them: the containerd driver's containers whose state
// dir is gone, whichever agent made them.
type orphanFinder interface {
	Orphans(ctx context.Context) ([]driver.Ref, error)
	DestroyOrphan(ctx context.Context, ref driver.Ref) error
}

// reapLoop reaps once now and then every ReapInterval, until ctx ends.
func (a *Agent) reapLoop(ctx context.Context) {
	tick, stop := a.cfg.NewReapTicker(a.cfg.ReapInterval)
	defer stop()
	for {
		a.reap(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

// reap destroys the sandboxes nothing claims once the driver made them
// ReapGrace ago, and logs each: the driver's own (List) that have no record
// and that the control plane does not place here (judged only once it has
// said what it places: until then Register's reconciliation decides), and
// the driver's orphans, whose state dir is gone. Sandboxes of other agents'
// state dirs are never touched. The tests and crashes that leave sandboxes
// running are what this cleans up after.
func (a *Agent) reap(ctx context.Context) {
	now := a.cfg.Now()
	old := func(ref driver.Ref) (time.Duration, bool) {
		age := now.Sub(ref.Created)
		return age, !ref.Created.IsZero() && age >= a.cfg.ReapGrace
	}
	// Under reconcileMu: no ensure is between its Create and its record.
	a.reconcileMu.Lock()
	refs, err := a.listAll(ctx)
	if err != nil && ctx.Err() == nil {
		a.log.Error("listing the drivers' sandboxes to reap", "err", err)
	}
	for _, ref := range refs {
		a.mu.Lock()
		b := a.boxes[ref.Key]
		claimed := b != nil && b.rec.Ref.ID == ref.ID && b.rec.State != sandbox.Evicted ||
			a.placed == nil || a.placed[ref.Key]
		a.mu.Unlock()
		claimed = claimed || a.pool.isKnown(ref.Key) // pooled: waits for its session
		age, ok := old(ref)
		if claimed || !ok {
			continue
		}
		a.log.Warn("reaping an unclaimed sandbox container", "id", ref.ID, "session_id", ref.Key, "age", age.Round(time.Second), "reason", "no record and no placement")
		if err := a.driverFor(ref).Destroy(ctx, ref); err != nil {
			a.log.Error("reaping an unclaimed sandbox container", "id", ref.ID, "session_id", ref.Key, "err", err)
		} else {
			a.removeStrayNetwork(ctx, ref.Key)
		}
	}
	a.reconcileMu.Unlock()
	for _, d := range a.drivers() {
		if o, ok := d.(orphanFinder); ok {
			a.reapOrphans(ctx, o, old)
		}
	}
}

// reapOrphans destroys the orphans of one driver once old says so.
func (a *Agent) reapOrphans(ctx context.Context, o orphanFinder, old func(driver.Ref) (time.Duration, bool)) {
	orphans, err := o.Orphans(ctx)
	if err != nil && ctx.Err() == nil {
		a.log.Error("listing orphaned sandboxes to reap", "err", err)
	}
	for _, ref := range orphans {
		age, ok := old(ref)
		if !ok {
			continue
		}
		a.log.Warn("reaping an unclaimed sandbox container", "id", ref.ID, "session_id", ref.Key, "age", age.Round(time.Second), "reason", "its state dir is gone", "state_dir", ref.Data["state_dir"])
		if err := o.DestroyOrphan(ctx, ref); err != nil {
			a.log.Error("reaping an unclaimed sandbox container", "id", ref.ID, "session_id", ref.Key, "err", err)
		}
	}
}
