package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Live moves
//
// A drain moves a gVisor sandbox live when its host and some other host
// are pausable (Register.pausable: every command runs under the sandbox's
// init, so a checkpoint keeps what runs):
//
//	fence (Raft and host) ── Pause (runsc checkpoint; its processes stop)
//	  ── ExportCheckpoint ──▶ blob store ◀── ExportWorkspace
//	  ── MovePlacement onto a pausable host, carrying the fence
//	  ── wait for ready (the new host makes a sandbox of the same image)
//	  ── ImportWorkspace ── RestoreCheckpoint (the new sandbox's init gives
//	     way to the old one's processes, memory and /tmp)
//	  ── LiftFence, recording Moved "live"
//
// Until the placement moved nothing is lost: any failure (the pause, an
// export, no pausable host with room) lets go of the fence and the sandbox
// moves with its workspace instead, in the same attempt; a sandbox still
// paused on the draining host then resumes on its next command if it
// stays. After the placement moved, a failed restore leaves the new
// sandbox with the workspace and a new init: a workspace move, and the
// session is told so. The session's next tool result says which happened
// (MovedNotice), and its event log gets a session.status_rescheduled.

// MovedNotice is the note that starts the first tool result after a drain
// moved a session's sandbox, by how it moved (scheduler.Moved*).
var MovedNotice = map[string]string{
	scheduler.MovedLive: "Note: this session's sandbox was moved live to another host (its host was drained): " +
		"its processes, background ones included, their memory and its files are as they were.",
	scheduler.MovedWorkspace: "Note: this session's sandbox was moved to another host (its host was drained) with its workspace: " +
		"the files under /workspace are as they were, but processes that were running (background jobs, servers) " +
		"and files outside /workspace, such as in /tmp, are gone.",
	scheduler.MovedWithoutWorkspace: "Note: this session's sandbox was moved to another host (its host was drained), " +
		"but its workspace could not be restored there: it starts empty, and files written earlier in this session are gone.",
}

// drainOne moves one sandbox off a draining host, live when it can (see
// above), else with its workspace. moved says whether the placement moved,
// how how (scheduler.Moved*); err, with moved, says what went wrong on the
// way (a live move that ended as a workspace move, a workspace that did
// not come back).
func (f *Fleet) drainOne(ctx, dctx context.Context, from string, p scheduler.Placement) (moved bool, to, how string, err error) {
	if f.liveCapable(from, p) {
		var fallback bool
		moved, to, how, fallback, err = f.moveLive(ctx, dctx, from, p)
		if !moved && fallback {
			f.log.Info("a sandbox cannot move live; moving its workspace", "session_id", p.SessionID, "from", from, "err", err)
		}
		if moved || !fallback {
			f.noteMoved(ctx, from, p, moved, to, how)
			return moved, to, how, err
		}
	}
	moved, to, err = f.moveWithWorkspace(ctx, dctx, from, p)
	how = scheduler.MovedWorkspace
	if err != nil {
		how = scheduler.MovedWithoutWorkspace
	}
	f.noteMoved(ctx, from, p, moved, to, how)
	return moved, to, how, err
}

// noteMoved records a drain's move in the session's event log.
func (f *Fleet) noteMoved(ctx context.Context, from string, p scheduler.Placement, moved bool, to, how string) {
	if !moved || !strings.HasPrefix(p.SessionID, SessionIDPrefix) { // the admin API may place other keys
		return
	}
	if err := f.cfg.Notices.Moved(ctx, tenant.ID(p.Tenant), p.SessionID, from, to, how); err != nil && !errdefs.IsNotFound(err) {
		f.log.Warn("recording a moved sandbox", "session_id", p.SessionID, "err", err)
	}
}

// liveCapable reports whether a placement may move live: a gVisor
// sandbox on a pausable host, and another pausable host that could take
// it. A sandbox with egress never does (its host refuses to checkpoint
// it: runsc's restore loses its network); it moves by workspace, and its
// new host makes its egress network.
func (f *Fleet) liveCapable(from string, p scheduler.Placement) bool {
	if p.Runtime != admission.RuntimeGVisor || len(p.AllowedHosts) > 0 {
		return false
	}
	ok := false
	f.node.Read(func(v raftfsm.View) {
		src, found := v.Host(from)
		if !found || !src.Pausable {
			return
		}
		for _, h := range v.Hosts() {
			if h.ID != from && liveTarget(h) {
				ok = true
				return
			}
		}
	})
	// A pausable host the tenant's pools do not allow is no target: say
	// so before pausing and exporting for nothing.
	return ok && f.canMove(p, liveTarget) == nil
}

// liveTarget is the hosts a live move may choose: pausable ones.
func liveTarget(h *scheduler.Host) bool { return h.Pausable }

// checkpointKey is where a placement's checkpoint image waits during its
// live move.
func checkpointKey(p scheduler.Placement) string {
	sum := sha256.Sum256([]byte(p.SessionID))
	return "drain/" + hex.EncodeToString(sum[:12]) + "/" + p.SandboxID + ".checkpoint.tar"
}

// moveLive moves one sandbox live (see above). fallback, when the
// placement did not move, says the workspace move may be tried at once:
// the failure was the live path's, not a busy sandbox's.
func (f *Fleet) moveLive(ctx, dctx context.Context, from string, p scheduler.Placement) (moved bool, to, how string, fallback bool, err error) {
	h, err := f.fence(dctx, p)
	if err != nil {
		return false, "", "", false, err
	}
	ckKey, wsKey := checkpointKey(p), blobKey(p)
	undo := func(err error) (bool, string, string, bool, error) {
		h.release(ctx)
		_ = f.cfg.Blobs.Delete(ctx, ckKey)
		_ = f.cfg.Blobs.Delete(ctx, wsKey)
		return false, "", "", true, err
	}
	if _, err := h.host.Pause(dctx, &pb.PauseRequest{Key: p.SessionID}); err != nil {
		return undo(fmt.Errorf("pausing the sandbox of %s on %s: %w", p.SessionID, from, errgrpc.FromStatus(err)))
	}
	if err := f.exportCheckpointTo(dctx, from, p.SessionID, ckKey); err != nil {
		return undo(fmt.Errorf("archiving the checkpoint of %s on %s: %w", p.SessionID, from, err))
	}
	if err := f.exportTo(dctx, from, p.SessionID, wsKey); err != nil {
		return undo(fmt.Errorf("archiving the workspace of %s on %s: %w", p.SessionID, from, err))
	}
	pl, err := f.move(dctx, from, p, &h.fence, liveTarget)
	if err != nil {
		return undo(fmt.Errorf("placing %s on another pausable host: %w", p.SessionID, err))
	}
	// Moved: from here the new placement carries the fence until its
	// sandbox is restored (or has its workspace at least).
	how = scheduler.MovedWithoutWorkspace
	defer func() { h.liftMoved(ctx, how) }()
	defer func() { _ = f.cfg.Blobs.Delete(ctx, ckKey) }()
	if err := f.bringImage(ctx, pl); err != nil {
		return true, pl.HostID, how, false, fmt.Errorf("bringing the image of %s's packages to %s: %w", p.SessionID, pl.HostID, err)
	}
	rctx, cancel := context.WithTimeout(ctx, f.cfg.ReadyTimeout)
	defer cancel()
	if err := f.waitReadyOn(rctx, p.SessionID, pl); err != nil {
		return true, pl.HostID, how, false, err
	}
	if err := f.importFrom(ctx, pl.HostID, p.SessionID, wsKey); err != nil {
		return true, pl.HostID, how, false, fmt.Errorf("restoring the workspace of %s on %s: %w", p.SessionID, pl.HostID, err)
	}
	if err := f.cfg.Blobs.Delete(ctx, wsKey); err != nil {
		f.log.Warn("removing a moved workspace from the blob store", "blob", wsKey, "err", err)
	}
	how = scheduler.MovedWorkspace
	if err := f.restoreCheckpointOn(ctx, pl.HostID, p.SessionID, ckKey); err != nil {
		// The host runs the sandbox with a new init over the workspace.
		f.log.Warn("a moved sandbox did not restore from its checkpoint; it keeps its workspace", "session_id", p.SessionID, "to", pl.HostID, "err", err)
		return true, pl.HostID, how, false, fmt.Errorf("restoring the processes of %s on %s (its workspace moved): %w", p.SessionID, pl.HostID, err)
	}
	how = scheduler.MovedLive
	f.log.Info("sandbox moved live", "session_id", p.SessionID, "from", from, "to", pl.HostID)
	return true, pl.HostID, how, false, nil
}

// exportCheckpointTo streams a paused sandbox's checkpoint from its host
// into the blob store.
func (f *Fleet) exportCheckpointTo(ctx context.Context, hostID, sessionID, key string) error {
	c, err := f.hostClient(hostID)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ExportCheckpoint(ctx, &pb.ExportCheckpointRequest{Key: sessionID})
	if err != nil {
		return errgrpc.FromStatus(err)
	}
	return f.cfg.Blobs.Put(ctx, key, &chunkReader{recv: func() ([]byte, error) {
		m, err := st.Recv()
		if err != nil && !errors.Is(err, io.EOF) {
			err = errgrpc.FromStatus(err)
		}
		return m.GetData(), err
	}})
}

// restoreCheckpointOn streams a checkpoint from the blob store into a
// sandbox, which restores from it.
func (f *Fleet) restoreCheckpointOn(ctx context.Context, hostID, sessionID, key string) error {
	c, err := f.hostClient(hostID)
	if err != nil {
		return err
	}
	rc, err := f.cfg.Blobs.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.RestoreCheckpoint(ctx)
	if err != nil {
		return errgrpc.FromStatus(err)
	}
	if err := st.Send(&pb.RestoreCheckpointRequest{Key: sessionID}); err != nil && !errors.Is(err, io.EOF) {
		return errgrpc.FromStatus(err)
	}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := rc.Read(buf)
		if n > 0 {
			if err := st.Send(&pb.RestoreCheckpointRequest{Data: buf[:n]}); err != nil {
				break // the server ended the call; CloseAndRecv says why
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	_, err = st.CloseAndRecv()
	return errgrpc.FromStatus(err)
}
