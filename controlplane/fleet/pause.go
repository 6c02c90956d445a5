package fleet

import (
	"context"
	"fmt"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Pausing idle sandboxes
//
//	SessionIdle (the session's runner committed session.status_idle)
//	  └─ timer, Config.PauseAfterIdle, on the runner's node (in memory: a
//	     node that takes the session over arms it at the session's next idle)
//	       cancelled by a tool call (SandboxFor) or SessionRunning
//	  └─ Pause: fence (Raft and host) ── host Pause (runsc checkpoint) ──
//	     SetPaused (Raft: the placement's CPU and memory are free, of its
//	     disk it keeps what the host measured the paused sandbox holds; the
//	     tenant's running-sandbox count drops) ── unfence
//	next tool call: SandboxFor finds the placement paused ── resume:
//	     SetPaused(false) (refused when the host or the quota has no room:
//	     the sandbox stays paused and the call fails with resource
//	     exhausted) ── host Resume (runsc restore) ── the call runs
//
// A paused sandbox resumes only on its own host, whose disk holds its
// checkpoint. Only gVisor sandboxes pause.

// SessionIdle tells the fleet that a session went idle: unless a tool call
// or SessionRunning comes first, its sandbox is paused after
// PauseAfterIdle.
func (f *Fleet) SessionIdle(sessionID string) {
	if f.cfg.PauseAfterIdle <= 0 || !f.pausable(sessionID) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.idle[sessionID]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(f.cfg.PauseAfterIdle, func() {
		f.mu.Lock()
		mine := f.idle[sessionID] == t
		if mine {
			delete(f.idle, sessionID)
		}
		f.mu.Unlock()
		if mine {
			f.pauseIdle(sessionID)
		}
	})
	f.idle[sessionID] = t
}

// SessionRunning tells the fleet that a session runs a turn: its sandbox
// is not paused for being idle.
func (f *Fleet) SessionRunning(sessionID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.idle[sessionID]; t != nil {
		t.Stop()
		delete(f.idle, sessionID)
	}
}

// pauseIdle pauses the sandbox of a session whose idle timer fired.
func (f *Fleet) pauseIdle(sessionID string) {
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.ReadyTimeout)
	defer cancel()
	err := f.Pause(ctx, sessionID)
	switch {
	case err == nil:
	case errdefs.IsNotFound(err), errdefs.IsFailedPrecondition(err), errdefs.IsConflict(err), errdefs.IsUnimplemented(err), ctx.Err() != nil:
		f.log.Debug("not pausing an idle session's sandbox", "session_id", sessionID, "err", err)
	default:
		f.log.Warn("pausing an idle session's sandbox", "session_id", sessionID, "err", err)
	}
}

// Pause checkpoints a session's sandbox on its host and records it paused,
// freeing its CPU and memory. A paused sandbox is left as it is; one that
// is not ready, is being moved or runs a command is not paused
// (errdefs.FailedPrecondition or Conflict).
func (f *Fleet) Pause(ctx context.Context, sessionID string) error {
	p, addr, ok := f.placement(sessionID)
	switch {
	case !ok:
		return errdefs.NotFound("session %s has no sandbox", sessionID)
	case p.Paused():
		return nil
	case !usable(p, addr, f.cfg.Now()):
		return errdefs.FailedPrecondition("the sandbox of session %s is not ready, its host is down or it is being moved", sessionID)
	}
	h, err := f.fence(ctx, p)
	if err != nil {
		return err
	}
	defer h.release(ctx)
	start := f.cfg.Now()
	res, err := h.host.Pause(ctx, &pb.PauseRequest{Key: sessionID})
	if err != nil {
		return fmt.Errorf("pausing the sandbox of session %s on host %s: %w", sessionID, p.HostID, errgrpc.FromStatus(err))
	}
	if _, err := raftfsm.Apply(ctx, f.node, raftfsm.SetPaused, raftfsm.Key("pause/"+sessionID),
		raftfsm.PausePayload{SessionID: sessionID, HostID: p.HostID, SandboxID: p.SandboxID, Paused: true, DiskMiB: raftfsm.DiskMiB(res.GetDiskBytes())}); err != nil {
		// The host resumes it on its next command; the placement still
		// holds its CPU and memory meanwhile.
		return fmt.Errorf("recording the paused sandbox of session %s: %w", sessionID, err)
	}
	f.log.Info("paused a session's sandbox", "session_id", sessionID, "host_id", p.HostID, "duration", f.cfg.Now().Sub(start))
	return nil
}

// resume takes the CPU and memory of a paused placement back on its host
// (Raft) and has the host restore the sandbox. A host without room, or a
// tenant at its quota of running sandboxes, is errdefs.ResourceExhausted
// and the sandbox stays paused.
func (f *Fleet) resume(ctx context.Context, p scheduler.Placement) error {
	if _, err := raftfsm.Apply(ctx, f.node, raftfsm.SetPaused, raftfsm.Key("resume/"+p.SessionID),
		raftfsm.PausePayload{SessionID: p.SessionID, HostID: p.HostID, SandboxID: p.SandboxID}); err != nil {
		if errdefs.KindOf(err) == errdefs.ResourceExhaustedKind {
			return errdefs.Wrap(errdefs.ResourceExhaustedKind, err, "this session's sandbox is paused and cannot resume on its host now (paused sandboxes resume on their own host only)")
		}
		return fmt.Errorf("resuming the sandbox of session %s: %w", p.SessionID, err)
	}
	c, err := f.hostClient(p.HostID)
	if err != nil {
		return err
	}
	start := f.cfg.Now()
	if _, err := c.Resume(ctx, &pb.ResumeRequest{Key: p.SessionID}); err != nil {
		// The host resumes it on its first command anyway.
		return fmt.Errorf("resuming the sandbox of session %s on host %s: %w", p.SessionID, p.HostID, errgrpc.FromStatus(err))
	}
	f.log.Info("resumed a paused sandbox", "session_id", p.SessionID, "host_id", p.HostID, "duration", f.cfg.Now().Sub(start))
	return nil
}
