package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// A drain is durable: StartDrain records it in Raft and returns; the
// leader's RunDrains runs it (moving the host's sandboxes, then evicting
// what is left at its deadline) and records every step and its end in
// Raft. A drain therefore outlives the call that started it and the node
// that took the call: a new leader runs the drains of the old one. Any node
// follows a drain by reading its record (WatchDrain). Uncordoning the host
// stops it.

// DrainOptions shape a drain.
type DrainOptions struct {
	// Deadline is how long the sandboxes have to move; past it what is
	// left is evicted. Required.
	Deadline time.Duration
	// MaxParallel bounds the sandboxes moved at once (default
	// DefaultDrainParallel, at most MaxDrainParallel).
	MaxParallel int
}

// Bounds of a drain's parallelism.
const (
	DefaultDrainParallel = 4
	MaxDrainParallel     = 64
)

// StartDrain marks the host ineligible and draining and records its drain
// in Raft, for the leader to run. A host already draining keeps its drain,
// which is returned. An unknown host is errdefs.NotFound and nothing
// changes.
func (f *Fleet) StartDrain(ctx context.Context, hostID string, o DrainOptions) (raftfsm.Drain, error) {
	if f.cfg.Blobs == nil {
		return raftfsm.Drain{}, errdefs.FailedPrecondition("draining needs a blob store for workspaces")
	}
	if o.Deadline <= 0 {
		return raftfsm.Drain{}, errdefs.InvalidArgument("a drain needs a positive deadline")
	}
	switch {
	case o.MaxParallel == 0:
		o.MaxParallel = DefaultDrainParallel
	case o.MaxParallel < 0 || o.MaxParallel > MaxDrainParallel:
		return raftfsm.Drain{}, errdefs.InvalidArgument("max_parallel must be between 1 and %d, got %d", MaxDrainParallel, o.MaxParallel)
	}
	now := f.cfg.Now()
	d, err := raftfsm.Apply(ctx, f.node, raftfsm.StartDrain, raftfsm.Key("drain/"+hostID),
		raftfsm.StartDrainPayload{HostID: hostID, Deadline: now.Add(o.Deadline), MaxParallel: o.MaxParallel, Started: now})
	if err != nil {
		return raftfsm.Drain{}, fmt.Errorf("draining host %s: %w", hostID, err)
	}
	f.log.Info("drain recorded", "host_id", hostID, "sandboxes", d.Total, "deadline", d.Deadline, "max_parallel", d.MaxParallel)
	return d, nil
}

// WatchDrain follows the host's drain from any node: fn gets the record
// and its steps after seq whenever it changes, the first time at once.
// It returns when the drain has finished (nil), when the host has no
// drain or is uncordoned (errdefs.NotFound, or FailedPrecondition while
// following), or when ctx ends; the drain goes on regardless.
func (f *Fleet) WatchDrain(ctx context.Context, hostID string, seq int, fn func(d raftfsm.Drain, steps []raftfsm.DrainStep)) error {
	followed, reported := false, false
	for {
		changed := f.node.Changed()
		var (
			d  raftfsm.Drain
			ok bool
		)
		f.node.Read(func(v raftfsm.View) { d, ok = v.Drain(hostID) })
		switch {
		case !ok && followed:
			return errdefs.FailedPrecondition("the drain of host %s was stopped: the host was uncordoned", hostID)
		case !ok:
			return errdefs.NotFound("host %s has no drain", hostID)
		}
		followed = true
		if steps := d.After(seq); len(steps) > 0 || !reported || !d.Running() {
			fn(d, steps)
			reported = true
			if len(steps) > 0 {
				seq = steps[len(steps)-1].Seq
			}
		}
		if !d.Running() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Drain starts the host's drain and follows it until it ends, calling
// progress (optional) with each step. If ctx ends first, the drain goes
// on (the leader runs it); only this call returns.
func (f *Fleet) Drain(ctx context.Context, hostID string, deadline time.Duration, progress func(DrainProgress)) error {
	if _, err := f.StartDrain(ctx, hostID, DrainOptions{Deadline: deadline}); err != nil {
		return err
	}
	if progress == nil {
		progress = func(DrainProgress) {}
	}
	return f.WatchDrain(ctx, hostID, 0, func(d raftfsm.Drain, steps []raftfsm.DrainStep) {
		// Done counts up through the batch to the record's count.
		done := d.Total - d.Remaining()
		for _, s := range steps {
			if DrainState(s.State).finishes() {
				done--
			}
		}
		for _, s := range steps {
			p := DrainProgress{Host: hostID, SessionID: s.SessionID, State: DrainState(s.State), To: s.To, Blob: s.Blob,
				Message: s.Message, Total: d.Total}
			if s.Error != "" {
				p.Err = errors.New(s.Error)
			}
			if p.State.finishes() {
				done++
			}
			p.Done = done
			progress(p)
		}
	})
}

// maxStepText bounds a step's error and message in the drain's Raft
// record, which keeps up to 1,024 steps: a host's error text is not ours
// to size.
const maxStepText = 1024

// drainRescan is how often RunDrains looks again with nothing changed: a
// leadership change applies no command, so it is not signalled.
const drainRescan = time.Second

// RunDrains runs, while this node leads, every drain recorded in Raft
// that has not finished, until ctx ends. A drain whose runner dies with
// its node (or loses the lead) is taken up by the next leader.
func (f *Fleet) RunDrains(ctx context.Context) {
	running := map[string]context.CancelFunc{}
	var mu sync.Mutex // guards running: a runner removes itself
	var wg sync.WaitGroup
	defer func() {
		mu.Lock()
		for _, cancel := range running {
			cancel()
		}
		mu.Unlock()
		wg.Wait()
	}()
	t := time.NewTicker(drainRescan)
	defer t.Stop()
	for {
		changed := f.node.Changed()
		leader := f.node.IsLeader()
		var drains []raftfsm.Drain
		if leader {
			f.node.Read(func(v raftfsm.View) { drains = v.RunningDrains() })
		}
		mu.Lock()
		if !leader {
			for host, cancel := range running {
				cancel()
				delete(running, host)
			}
		}
		for _, d := range drains {
			if _, ok := running[d.HostID]; ok {
				continue
			}
			dctx, cancel := context.WithCancel(ctx)
			running[d.HostID] = cancel
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(running, d.HostID)
					mu.Unlock()
					cancel()
				}()
				f.runDrain(dctx, d)
			})
		}
		mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// runDrain moves the drain's sandboxes to other hosts, MaxParallel at a
// time, between their tool calls (see the package doc's fence): live where
// both hosts are pausable (live.go), else with the workspace; what is
// still there at the deadline is evicted. Each step, and the end, is
// recorded in Raft. It returns early when ctx ends (the lead is lost) or
// the drain's record goes (the host was uncordoned).
func (f *Fleet) runDrain(ctx context.Context, d raftfsm.Drain) {
	hostID := d.HostID
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// The record gone (uncordoned) or finished elsewhere ends this run.
	go func() {
		for {
			changed := f.node.Changed()
			var cur raftfsm.Drain
			var ok bool
			f.node.Read(func(v raftfsm.View) { cur, ok = v.Drain(hostID) })
			if !ok || !cur.Running() || !cur.Started.Equal(d.Started) {
				stop()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
	}()
	onHost := func() (ps []scheduler.Placement) {
		f.node.Read(func(v raftfsm.View) { ps = v.HostPlacements(hostID) })
		return ps
	}
	record := func(p DrainProgress) {
		_, err := raftfsm.Apply(ctx, f.node, raftfsm.RecordDrainStep, raftfsm.Key("drain-step/"+hostID),
			raftfsm.DrainStepPayload{HostID: hostID, Step: raftfsm.DrainStep{SessionID: p.SessionID, State: string(p.State),
				To: p.To, Blob: p.Blob, Error: textcut.Prefix(errText(p.Err), maxStepText), Message: textcut.Prefix(p.Line(), maxStepText)}})
		if err != nil && ctx.Err() == nil {
			f.log.Warn("recording a drain step", "host_id", hostID, "session_id", p.SessionID, "err", err)
		}
	}
	f.log.Info("draining host", "host_id", hostID, "sandboxes", len(onHost()), "deadline", d.Deadline, "max_parallel", d.MaxParallel)
	dctx, cancel := context.WithDeadline(ctx, d.Deadline)
	defer cancel()
	for ps := onHost(); len(ps) > 0 && dctx.Err() == nil; ps = onHost() {
		moved := 0
		// A few moves at once: each waits mostly on its two hosts (the
		// checkpoint, the copies, the restore), and a plan made stale by
		// another is refused by the leader and made again (move).
		sem := make(chan struct{}, d.MaxParallel)
		var wg sync.WaitGroup
		var mu sync.Mutex // guards moved
		for _, p := range ps {
			if dctx.Err() != nil {
				break
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				pr := DrainProgress{Host: hostID, SessionID: p.SessionID}
				start := f.cfg.Now()
				ok, to, how, err := f.drainOne(ctx, dctx, hostID, p)
				pr.To, pr.Err, pr.Took = to, err, f.cfg.Now().Sub(start)
				switch {
				case !ok:
					pr.State = DrainRetrying
				case how == scheduler.MovedLive:
					pr.State = DrainMovedLive
				case how == scheduler.MovedWorkspace:
					pr.State = DrainMoved
				default:
					pr.State, pr.Blob = DrainMovedWithoutWorkspace, blobKey(p)
				}
				if ok {
					mu.Lock()
					moved++
					mu.Unlock()
				}
				record(pr)
			})
		}
		wg.Wait()
		if moved == 0 && len(onHost()) > 0 {
			// Every sandbox left was busy or could not go yet: give their
			// calls and the other hosts a moment before the next round.
			_ = pause(dctx, 200*time.Millisecond)
		}
	}
	if ctx.Err() != nil {
		return // the lead was lost, or the drain stopped: not finished here
	}
	for _, p := range onHost() {
		f.keepBeforeRelease(ctx, p, OriginReleased)
		_, err := f.Release(ctx, p.SessionID)
		record(DrainProgress{Host: hostID, SessionID: p.SessionID, State: DrainEvicted, Err: err})
	}
	if _, err := raftfsm.Apply(ctx, f.node, raftfsm.EndDrain, raftfsm.Key("drain-end/"+hostID),
		raftfsm.EndDrainPayload{HostID: hostID, At: f.cfg.Now()}); err != nil {
		f.log.Warn("ending a drain", "host_id", hostID, "err", err)
		return
	}
	f.log.Info("host drained", "host_id", hostID, "sandboxes", d.Total)
}

// finishes reports whether a step in this state is the sandbox's last.
func (s DrainState) finishes() bool { return s != DrainRetrying }

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Line is the step's line for the operator: "<session_id>: <state> to
// <host>", with where the workspace is kept and the error, if any.
func (p DrainProgress) Line() string {
	msg := fmt.Sprintf("%s: %s", p.SessionID, p.State)
	if p.To != "" {
		msg += " to " + p.To
	}
	if p.Blob != "" {
		msg += ", workspace kept as " + p.Blob
	}
	if p.Err != nil {
		msg += ": " + p.Err.Error()
	}
	return msg
}
