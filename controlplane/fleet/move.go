package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Bounds of a move.
const (
	// fenceWait bounds the wait for a sandbox's calls in flight: a long
	// tool call does not hold up a drain's other sandboxes, which come
	// first; the drain comes back to this one after them.
	fenceWait = time.Second
	// fenceTTL bounds one move, from the fence to the workspace restored:
	// past it the fence lapses by itself, in Raft and on the host.
	fenceTTL = 5 * time.Minute
)

// DrainState is what happened to one sandbox during a drain.
type DrainState string

// The drain states.
const (
	// DrainMovedLive: the sandbox runs on another host restored from its
	// checkpoint: its processes, memory and workspace as they were.
	DrainMovedLive DrainState = "moved_live"
	// DrainMoved: the sandbox runs on another host with its workspace
	// (a new sandbox: its processes did not move).
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
	Host      string
	SessionID string
	State     DrainState
	To        string // the new host, once moved
	Blob      string // where the workspace is kept, for DrainMovedWithoutWorkspace
	Err       error
	// Message is the step's line (Line), as a drain followed from its
	// record carries it in place of To, Blob and Err.
	Message string
	// Took is how long this attempt at the sandbox took.
	Took time.Duration
	// Done counts the sandboxes finished (moved or evicted) of Total, the
	// number on the host when the drain began.
	Done, Total int
}

// blobKey is where a placement's workspace waits during its move.
func blobKey(p scheduler.Placement) string {
	sum := sha256.Sum256([]byte(p.SessionID))
	return "drain/" + hex.EncodeToString(sum[:12]) + "/" + p.SandboxID + ".tar"
}

// moveWithWorkspace moves one sandbox off a draining host: fence it, export
// the workspace into the blob store, move the placement (still fenced),
// wait for the new sandbox, import the workspace there and lift the fence.
// Fencing, exporting and planning end with dctx (the drain's deadline);
// once the placement has moved, the rest runs to completion under ctx.
// moved says whether the placement moved.
func (f *Fleet) moveWithWorkspace(ctx, dctx context.Context, from string, p scheduler.Placement) (moved bool, to string, err error) {
	// No host may take it (say, the tenant's pools have no other host
	// with room): say so before fencing and exporting for nothing; it
	// stays, and the drain tries it again.
	if err := f.canMove(p, nil); err != nil {
		return false, "", fmt.Errorf("placing %s elsewhere: %w", p.SessionID, err)
	}
	h, err := f.fence(dctx, p)
	if err != nil {
		return false, "", err
	}
	key := blobKey(p)
	if err := f.exportTo(dctx, from, p.SessionID, key); err != nil {
		h.release(ctx)
		return false, "", fmt.Errorf("archiving the workspace of %s on %s: %w", p.SessionID, from, err)
	}
	pl, err := f.move(dctx, from, p, &h.fence, nil)
	if err != nil {
		h.release(ctx)
		_ = f.cfg.Blobs.Delete(ctx, key)
		return false, "", fmt.Errorf("placing %s elsewhere: %w", p.SessionID, err)
	}
	// The new placement carries the fence until its workspace is back; the
	// old sandbox stays fenced on its host until the host destroys it.
	defer func() {
		how := scheduler.MovedWorkspace
		if err != nil {
			how = scheduler.MovedWithoutWorkspace
		}
		h.liftMoved(ctx, how)
	}()
	if err := f.bringImage(ctx, pl); err != nil {
		return true, pl.HostID, fmt.Errorf("bringing the image of %s's packages to %s: %w", p.SessionID, pl.HostID, err)
	}
	rctx, cancel := context.WithTimeout(ctx, f.cfg.ReadyTimeout)
	defer cancel()
	if err := f.waitReadyOn(rctx, p.SessionID, pl); err != nil {
		return true, pl.HostID, err
	}
	if err := f.importFrom(ctx, pl.HostID, p.SessionID, key); err != nil {
		return true, pl.HostID, fmt.Errorf("restoring the workspace of %s on %s: %w", p.SessionID, pl.HostID, err)
	}
	if err := f.cfg.Blobs.Delete(ctx, key); err != nil {
		f.log.Warn("removing a moved workspace from the blob store", "blob", key, "err", err)
	}
	f.log.Info("sandbox moved", "session_id", p.SessionID, "from", from, "to", pl.HostID)
	return true, pl.HostID, nil
}

// held is a mover's fence on one session's sandbox.
type held struct {
	f         *Fleet
	sessionID string
	fence     scheduler.Fence
	host      pb.SandboxServiceClient // where it is fenced on a host too
	hostID    string
}

// fence takes a session's sandbox for a move: in Raft (tool calls on every
// node wait) and on its host (calls already past that check finish first;
// a new one is refused). It fails, and leaves nothing fenced, when another
// mover holds the sandbox or its calls outlast fenceWait.
func (f *Fleet) fence(ctx context.Context, p scheduler.Placement) (*held, error) {
	now := f.cfg.Now()
	h := &held{f: f, sessionID: p.SessionID, hostID: p.HostID,
		fence: scheduler.Fence{Owner: raftfsm.Key("mover"), Until: now.Add(fenceTTL)}}
	if _, err := raftfsm.Apply(ctx, f.node, raftfsm.SetFence, raftfsm.Key("fence/"+p.SessionID),
		raftfsm.FencePayload{SessionID: p.SessionID, Owner: h.fence.Owner, Until: h.fence.Until, Now: now}); err != nil {
		return nil, err
	}
	c, err := f.hostClient(p.HostID)
	if err == nil {
		_, err = c.Fence(ctx, &pb.FenceRequest{Key: p.SessionID, Wait: durationpb.New(fenceWait), Ttl: durationpb.New(fenceTTL)})
		err = errgrpc.FromStatus(err)
	}
	if err != nil {
		h.lift(ctx)
		return nil, fmt.Errorf("fencing the sandbox of %s on %s: %w", p.SessionID, p.HostID, err)
	}
	h.host = c
	return h, nil
}

// lift lets go of the fence in Raft (on whichever placement now carries
// it: the one it was taken on, or the one a move made).
func (h *held) lift(ctx context.Context) { h.liftMoved(ctx, "") }

// liftMoved is lift at the end of a move, recording on the placement how
// its sandbox came there (scheduler.Placement.Moved; "" records nothing).
func (h *held) liftMoved(ctx context.Context, how string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := raftfsm.Apply(ctx, h.f.node, raftfsm.LiftFence, raftfsm.Key("lift/"+h.sessionID),
		raftfsm.FencePayload{SessionID: h.sessionID, Owner: h.fence.Owner, Now: h.f.cfg.Now(), Moved: how}); err != nil && !errdefs.IsNotFound(err) {
		h.f.log.Warn("lifting a sandbox's fence (it lapses by itself)", "session_id", h.sessionID, "until", h.fence.Until, "err", err)
	}
}

// release lets go of the fence on the host and in Raft: the move did not
// happen.
func (h *held) release(ctx context.Context) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := h.host.Unfence(uctx, &pb.UnfenceRequest{Key: h.sessionID}); err != nil {
		h.f.log.Warn("unfencing a sandbox on its host (it lapses by itself)", "session_id", h.sessionID, "host_id", h.hostID, "err", err)
	}
	h.lift(ctx)
}

// waitReadyOn waits until the placement pl (its host and sandbox) is ready,
// whatever its fence.
func (f *Fleet) waitReadyOn(ctx context.Context, sessionID string, pl scheduler.Placement) error {
	for {
		changed := f.node.Changed()
		p, _, ok := f.placement(sessionID)
		switch {
		case !ok || p.HostID != pl.HostID || p.SandboxID != pl.SandboxID:
			return errdefs.Conflict("session %s left host %s before its sandbox was ready there", sessionID, pl.HostID)
		case p.Ready:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.KindOf(ctx.Err()), ctx.Err(), "waiting for the sandbox of session %s on %s", sessionID, pl.HostID)
		}
	}
}

// move places a session elsewhere and moves its placement off from in one
// Raft command, carrying fence (nil: none), planning again while the plan
// is stale: Apply returns once this node has applied the refusal, so the
// next plan sees at least what the leader saw. only, when set, is the
// hosts the plan may choose from (within the tenant's pools).
func (f *Fleet) move(ctx context.Context, from string, p scheduler.Placement, fence *scheduler.Fence, only func(*scheduler.Host) bool) (scheduler.Placement, error) {
	req := f.moveRequest(p)
	key := raftfsm.Key("move/" + p.SessionID)
	const attempts = 5
	for i := 1; ; i++ {
		var (
			plan scheduler.Plan
			err  error
		)
		f.node.Read(func(v raftfsm.View) { plan, err = scheduler.PlaceMove(v, req, f.cfg.Scheduler, only) })
		if err != nil {
			return scheduler.Placement{}, err
		}
		// A plan back onto from means this node has not yet applied the
		// host's change of status: the leader refuses it as a conflict.
		pl, err := raftfsm.Apply(ctx, f.node, raftfsm.MovePlacement, fmt.Sprintf("%s/%d", key, i),
			raftfsm.MovePayload{SessionID: p.SessionID, From: from, Plan: plan, Fence: fence})
		if !errdefs.IsConflict(err) || i == attempts {
			return pl, err
		}
	}
}

// moveRequest is the request that places p again elsewhere: what it runs,
// and where its tenant may go today.
func (f *Fleet) moveRequest(p scheduler.Placement) scheduler.Request {
	return f.withPlacement(scheduler.Request{SessionID: p.SessionID, Tenant: p.Tenant, Runtime: p.Runtime, Provider: p.Provider,
		Resources: p.Resources, Limits: p.Limits, Image: p.Image, Pids: p.Pids, AllowedHosts: p.AllowedHosts})
}

// canMove returns the scheduler's refusal when no other host (of those
// only accepts, all without it) may take p now, on this node's state (a
// *scheduler.NoFitError, which names the tenant's pools), and nil
// otherwise.
func (f *Fleet) canMove(p scheduler.Placement, only func(*scheduler.Host) bool) error {
	var err error
	f.node.Read(func(v raftfsm.View) {
		_, err = scheduler.PlaceMove(v, f.moveRequest(p), f.cfg.Scheduler, only)
	})
	if scheduler.IsNoFit(err) {
		return err
	}
	return nil
}

// Reschedule moves every placement off a host that is down, each to a new,
// empty sandbox elsewhere, and records it in the session's log. What
// cannot move now (no host fits) is tried again at the next call: the host
// service calls it on the leader at every check of a down host that still
// holds placements.
func (f *Fleet) Reschedule(ctx context.Context, hostID string) {
	var ps []scheduler.Placement
	f.node.Read(func(v raftfsm.View) { ps = v.HostPlacements(hostID) })
	for _, p := range ps {
		pl, err := f.move(ctx, hostID, p, nil, nil)
		if err != nil {
			f.log.Warn("rescheduling a sandbox off a down host", "host_id", hostID, "session_id", p.SessionID, "err", err)
			continue
		}
		f.log.Info("sandbox rescheduled", "session_id", p.SessionID, "from", hostID, "to", pl.HostID)
		if err := f.bringImage(ctx, pl); err != nil {
			// The session's next tool call tries again (sandboxSlow).
			f.log.Warn("bringing a rescheduled sandbox's image to its new host", "session_id", p.SessionID, "host_id", pl.HostID, "err", err)
		}
		if strings.HasPrefix(p.SessionID, SessionIDPrefix) { // the admin API may place other keys
			if err := f.cfg.Notices.Rescheduled(ctx, tenant.ID(p.Tenant), p.SessionID, hostID, pl.HostID); err != nil && !errdefs.IsNotFound(err) {
				f.log.Warn("recording a rescheduled sandbox", "session_id", p.SessionID, "err", err)
			}
		}
	}
}

// Evict stops a session's sandbox between its tool calls, takes its
// workspace as the session's snapshot and releases its placement; the
// leader then has its host destroy it, and the session's next tool call
// gets a new sandbox with the workspace. A session without a
// placement is errdefs.NotFound.
func (f *Fleet) Evict(ctx context.Context, sessionID string) error {
	p, _, ok := f.placement(sessionID)
	if !ok {
		return errdefs.NotFound("session %s has no sandbox", sessionID)
	}
	h, err := f.fence(ctx, p)
	if err != nil {
		return err
	}
	f.keepBeforeRelease(ctx, p, OriginReleased)
	if _, err := f.Release(ctx, sessionID); err != nil {
		h.release(ctx)
		return err
	}
	return nil
}

// exportTo streams a sandbox's workspace from its host into the blob store.
func (f *Fleet) exportTo(ctx context.Context, hostID, sessionID, key string) error {
	_, err := f.export(ctx, hostID, &pb.ExportWorkspaceRequest{Key: sessionID}, key)
	return err
}

// importFrom streams a workspace from the blob store into a sandbox.
func (f *Fleet) importFrom(ctx context.Context, hostID, sessionID, key string) error {
	_, err := f.importSnapshot(ctx, hostID, sessionID, key)
	return err
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
