package fleet

import (
	"context"
	"errors"
	"fmt"

	"corral.dev/corral/internal/errdefs"
)

// Archived sessions
//
//	SessionArchived (the public API archived the session: from now on it
//	accepts no events, so no tool call needs its sandbox)
//	  ├─ ArchiveReleaseAfter 0: Release at once
//	  └─ otherwise Pause, in the background: a gVisor sandbox on a pausable
//	     host is checkpointed (its CPU and memory free, its disk kept, the
//	     tenant's sandbox counted as paused); any other is left as it is
//	sweep (the leader, every SweepInterval): the placement of a session
//	     archived ArchiveReleaseAfter ago or longer is released: the host
//	     destroys the sandbox, its placement and the tenant's quota are freed
//
// The release is judged from the session's archived_at in PostgreSQL by
// whichever node leads, so a crash or a change of leader delays it by one
// sweep at most. The pause is tried once, by the node that archived the
// session; one that fails (a command still in flight, the host down, a
// move under way) leaves the sandbox as it is until its release. A session
// whose sandbox was released gets a new one, placed the usual way, at its
// next tool call, as any session without a sandbox; an archived session
// makes none, since it accepts no events.

// SessionArchived tells the fleet that a session was archived: its sandbox
// is released at once (ArchiveReleaseAfter zero) or paused and released by
// the sweep after ArchiveReleaseAfter. It returns at once; the work runs
// in the background until the fleet closes.
func (f *Fleet) SessionArchived(sessionID string) {
	f.SessionRunning(sessionID) // no idle pause: the pause below, if any
	go func() {
		ctx, cancel := context.WithTimeout(f.ctx, f.cfg.ReadyTimeout)
		defer cancel()
		if f.cfg.ArchiveReleaseAfter <= 0 {
			f.releaseArchived(ctx, sessionID)
			return
		}
		if !f.pausable(sessionID) {
			return // only gVisor sandboxes pause: kept as they are
		}
		err := f.Pause(ctx, sessionID)
		switch {
		case err == nil:
			f.log.Info("paused an archived session's sandbox", "session_id", sessionID, "release_after", f.cfg.ArchiveReleaseAfter)
		case errdefs.IsNotFound(err), errdefs.IsFailedPrecondition(err), errdefs.IsConflict(err), errdefs.IsUnimplemented(err), ctx.Err() != nil:
			f.log.Debug("not pausing an archived session's sandbox", "session_id", sessionID, "err", err)
		default:
			f.log.Warn("pausing an archived session's sandbox", "session_id", sessionID, "err", err)
		}
	}()
}

// releaseArchived releases an archived session's sandbox, if it has one.
func (f *Fleet) releaseArchived(ctx context.Context, sessionID string) error {
	_, err := f.Release(ctx, sessionID)
	switch {
	case errdefs.IsNotFound(err):
		return nil
	case err != nil:
		f.log.Warn("releasing an archived session's sandbox (the sweep retries)", "session_id", sessionID, "err", err)
		return err
	}
	f.forget(sessionID)
	f.log.Info("released the sandbox of an archived session", "session_id", sessionID, "release_after", f.cfg.ArchiveReleaseAfter)
	return nil
}

// sweepArchived releases the placements, among those of the sessions ids,
// of sessions archived ArchiveReleaseAfter ago or longer.
func (f *Fleet) sweepArchived(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	archived, err := f.cfg.Sessions.Archived(ctx, ids)
	if err != nil {
		return err
	}
	now := f.cfg.Now()
	var errs []error
	for id, at := range archived {
		if now.Sub(at) < f.cfg.ArchiveReleaseAfter {
			continue
		}
		if err := f.releaseArchived(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("session %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
