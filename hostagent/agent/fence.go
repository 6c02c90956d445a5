package agent

import (
	"context"
	"time"

	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// maxFence bounds a fence's lifetime and the wait for the calls in flight,
// whatever a caller asks.
const maxFence = time.Hour

// Fence implements SandboxService.Fence: from now until ttl the sandbox
// takes no new calls (use refuses them); it returns once the calls in
// flight have ended, or lifts the fence again and answers Unavailable if
// they outlast wait.
func (s *sandboxServer) Fence(ctx context.Context, req *pb.FenceRequest) (*pb.FenceResponse, error) {
	ttl, wait := req.GetTtl().AsDuration(), req.GetWait().AsDuration()
	switch {
	case req.Key == "":
		return nil, errdefs.InvalidArgument("fence: a sandbox key is required")
	case ttl <= 0 || ttl > maxFence || wait < 0 || wait > maxFence:
		return nil, errdefs.InvalidArgument("fence: ttl must be in (0, %v] and wait in [0, %v], got %v and %v", maxFence, maxFence, ttl, wait)
	}
	a := s.a
	a.mu.Lock()
	b := a.boxes[req.Key]
	if b == nil {
		a.mu.Unlock()
		return nil, errdefs.NotFound("no sandbox %q on host %s", req.Key, a.cfg.HostID)
	}
	b.fencedUntil = a.cfg.Now().Add(ttl)
	if b.inflight == 0 {
		a.mu.Unlock()
		a.log.Info("sandbox fenced", "session_id", req.Key, "ttl", ttl)
		return &pb.FenceResponse{}, nil
	}
	if b.idle == nil {
		b.idle = make(chan struct{})
	}
	idle, busy := b.idle, b.inflight
	a.mu.Unlock()

	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-idle:
		a.log.Info("sandbox fenced", "session_id", req.Key, "ttl", ttl, "waited_for", busy)
		return &pb.FenceResponse{}, nil
	case <-t.C:
	case <-ctx.Done():
	}
	a.mu.Lock()
	b.fencedUntil = time.Time{}
	busy = b.inflight
	a.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errdefs.Unavailable("sandbox %q on host %s still has %d calls in flight after %v; not fenced", req.Key, a.cfg.HostID, busy, wait)
}

// Unfence implements SandboxService.Unfence.
func (s *sandboxServer) Unfence(_ context.Context, req *pb.UnfenceRequest) (*pb.UnfenceResponse, error) {
	if req.Key == "" {
		return nil, errdefs.InvalidArgument("unfence: a sandbox key is required")
	}
	a := s.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.boxes[req.Key]; b != nil {
		b.fencedUntil = time.Time{}
	}
	return &pb.UnfenceResponse{}, nil
}
