package hosts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// readyTimeout bounds the wait for a moved sandbox to come up on its new
// host before its workspace is imported.
const readyTimeout = 2 * time.Minute

// lockWait bounds one wait for a session's lock during a drain.
const lockWait = time.Second

// DrainState is what happened to one sandbox during a drain.
type DrainState string

// The drain states.
const (
	// DrainMoved: the sandbox runs on another host with its workspace.
	DrainMoved DrainState = "moved"
	// DrainRetrying: this attempt failed before the placement moved; the
	// sandbox stays on the draining host and is tried again.
	DrainRetrying DrainState = "retrying"
	// DrainMovedWithoutWorkspace: the placement moved but the workspace
	// could not be restored; it is kept in the blob store under Blob.
	DrainMovedWithoutWorkspace DrainState = "moved_without_workspace"
	// DrainEvicted: still on the host at the deadline; destroyed and released.
	DrainEvicted DrainState = "evicted"
)

// DrainProgress reports one sandbox's step in a drain.
type DrainProgress struct {
	Host       string
	SessionKey string
	State      DrainState
	To         string // the new host, once moved
	Blob       string // where the workspace is kept, for DrainMovedWithoutWorkspace
	Err        error
	// Done counts the sandboxes finished (moved or evicted) of Total, the
	// number on the host when the drain began.
	Done, Total int
}

// Drain marks the host ineligible and draining through Raft, then moves its
// sandboxes to other hosts one at a time, each with its workspace and under
// its session lock; what is still there when deadline has passed is
// evicted. progress (optional) is called after each step. An unknown host is
// errdefs.NotFound and nothing changes. Any node can drain; see the package
// doc about session locks.
func (s *Service) Drain(ctx context.Context, hostID string, deadline time.Duration, progress func(DrainProgress)) error {
	if s.cfg.Blobs == nil {
		return errdefs.FailedPrecondition("draining needs a blob store for workspaces")
	}
	if deadline <= 0 {
		return errdefs.InvalidArgument("a drain needs a positive deadline")
	}
	if progress == nil {
		progress = func(DrainProgress) {}
	}
	no, draining := false, true
	if err := s.apply(ctx, raftfsm.CmdSetHostStatus, raftfsm.Key("drain/"+hostID),
		raftfsm.HostStatusPayload{ID: hostID, Eligible: &no, Draining: &draining}, nil); err != nil {
		return fmt.Errorf("draining host %s: %w", hostID, err)
	}
	onHost := func() (ps []scheduler.Placement) {
		s.node.Read(func(v raftfsm.View) { ps = v.HostPlacements(hostID) })
		return ps
	}
	total, done := len(onHost()), 0
	s.log.Info("draining host", "host_id", hostID, "sandboxes", total, "deadline", deadline)
	dctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	for ps := onHost(); len(ps) > 0 && dctx.Err() == nil; ps = onHost() {
		for _, p := range ps {
			if dctx.Err() != nil {
				break
			}
			pr := DrainProgress{Host: hostID, SessionKey: p.SessionKey, Total: total}
			moved, to, err := s.moveWithWorkspace(ctx, dctx, hostID, p)
			pr.To, pr.Err = to, err
			switch {
			case err == nil:
				pr.State = DrainMoved
			case moved:
				pr.State, pr.Blob = DrainMovedWithoutWorkspace, blobKey(p)
			default:
				pr.State = DrainRetrying
			}
			if moved {
				done++
			}
			pr.Done = done
			progress(pr)
		}
		if len(onHost()) > 0 {
			_ = pause(dctx, 200*time.Millisecond)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, p := range onHost() {
		err := s.release(ctx, p.SessionKey)
		done++
		progress(DrainProgress{Host: hostID, SessionKey: p.SessionKey, State: DrainEvicted, Err: err, Done: done, Total: total})
	}
	s.log.Info("host drained", "host_id", hostID, "sandboxes", total)
	return nil
}

// blobKey is where a placement's workspace waits during its move.
func blobKey(p scheduler.Placement) string {
	sum := sha256.Sum256([]byte(p.SessionKey))
	return "drain/" + hex.EncodeToString(sum[:12]) + "/" + p.SandboxID + ".tar"
}

// moveWithWorkspace moves one sandbox off a draining host: under the
// session's lock, export the workspace into the blob store, move the
// placement, wait for the new sandbox and import the workspace there.
// Waiting for the lock, exporting and planning end with dctx (the drain's
// deadline); once the placement has moved, the rest runs to completion
// under ctx. moved says whether the placement moved.
func (s *Service) moveWithWorkspace(ctx, dctx context.Context, from string, p scheduler.Placement) (moved bool, to string, err error) {
	// A long tool call does not hold up the other sandboxes: wait a while,
	// then come back to this one after them.
	lctx, cancel := context.WithTimeout(dctx, lockWait)
	unlock, err := s.LockSandbox(lctx, p.SessionKey)
	cancel()
	if err != nil {
		return false, "", err
	}
	defer unlock()
	var still bool
	s.node.Read(func(v raftfsm.View) { still = v.HasPlacementOn(from, p.SessionKey) })
	if !still {
		return false, "", errdefs.Conflict("session %s left host %s while waiting for its lock", p.SessionKey, from)
	}
	key := blobKey(p)
	if err := s.exportTo(dctx, from, p.SessionKey, key); err != nil {
		return false, "", fmt.Errorf("archiving the workspace of %s on %s: %w", p.SessionKey, from, err)
	}
	pl, err := s.move(dctx, from, p)
	if err != nil {
		_ = s.cfg.Blobs.Delete(ctx, key)
		return false, "", fmt.Errorf("placing %s elsewhere: %w", p.SessionKey, err)
	}
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := s.waitOn(rctx, pl.HostID, p.SessionKey); err != nil {
		return true, pl.HostID, err
	}
	if err := s.importFrom(ctx, pl.HostID, p.SessionKey, key); err != nil {
		return true, pl.HostID, fmt.Errorf("restoring the workspace of %s on %s: %w", p.SessionKey, pl.HostID, err)
	}
	if err := s.cfg.Blobs.Delete(ctx, key); err != nil {
		s.log.Warn("removing a moved workspace from the blob store", "blob", key, "err", err)
	}
	s.log.Info("sandbox moved", "session", p.SessionKey, "from", from, "to", pl.HostID)
	return true, pl.HostID, nil
}

// exportTo streams a sandbox's workspace from its host into the blob store.
func (s *Service) exportTo(ctx context.Context, hostID, sessionKey, key string) error {
	c, err := s.Sandbox(hostID)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ExportWorkspace(ctx, &pb.ExportWorkspaceRequest{Key: sessionKey})
	if err != nil {
		return errgrpc.FromStatus(err)
	}
	return s.cfg.Blobs.Put(ctx, key, &chunkReader{recv: func() ([]byte, error) {
		m, err := st.Recv()
		if err != nil && !errors.Is(err, io.EOF) {
			err = errgrpc.FromStatus(err)
		}
		return m.GetData(), err
	}})
}

// importFrom streams a workspace from the blob store into a sandbox.
func (s *Service) importFrom(ctx context.Context, hostID, sessionKey, key string) error {
	c, err := s.Sandbox(hostID)
	if err != nil {
		return err
	}
	rc, err := s.cfg.Blobs.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ImportWorkspace(ctx)
	if err != nil {
		return errgrpc.FromStatus(err)
	}
	if err := st.Send(&pb.ImportWorkspaceRequest{Key: sessionKey}); err != nil && !errors.Is(err, io.EOF) {
		return errgrpc.FromStatus(err)
	}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := rc.Read(buf)
		if n > 0 {
			if err := st.Send(&pb.ImportWorkspaceRequest{Data: buf[:n]}); err != nil {
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

// chunkReader reads a byte stream that arrives in messages.
type chunkReader struct {
	buf  []byte
	recv func() ([]byte, error)
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		b, err := r.recv()
		if err != nil {
			return 0, err
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Evict releases a session's sandbox through Raft, under its session lock;
// the leader then has its host destroy it. A session without a placement is
// errdefs.NotFound.
func (s *Service) Evict(ctx context.Context, sessionKey string) error {
	unlock, err := s.LockSandbox(ctx, sessionKey)
	if err != nil {
		return err
	}
	defer unlock()
	return s.release(ctx, sessionKey)
}

func (s *Service) release(ctx context.Context, sessionKey string) error {
	return s.apply(ctx, raftfsm.CmdRelease, raftfsm.Key("evict/"+sessionKey), raftfsm.ReleasePayload{SessionKey: sessionKey}, nil)
}
