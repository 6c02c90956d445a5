package agent

import (
	"context"
	"fmt"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Pause implements SandboxService.Pause.
func (s *sandboxServer) Pause(ctx context.Context, req *pb.PauseRequest) (*pb.PauseResponse, error) {
	if req.Key == "" {
		return nil, errdefs.InvalidArgument("pause: a sandbox key is required")
	}
	disk, err := s.a.pause(ctx, req.Key)
	if err != nil {
		return nil, err
	}
	return &pb.PauseResponse{DiskBytes: disk}, nil
}

// Resume implements SandboxService.Resume.
func (s *sandboxServer) Resume(ctx context.Context, req *pb.ResumeRequest) (*pb.ResumeResponse, error) {
	if req.Key == "" {
		return nil, errdefs.InvalidArgument("resume: a sandbox key is required")
	}
	if err := s.a.resumeIfPaused(ctx, req.Key); err != nil {
		return nil, err
	}
	return &pb.ResumeResponse{}, nil
}

// pause checkpoints an idle ready sandbox through the driver and records
// it paused; new commands are refused meanwhile (Conflict), and one
// running refuses the pause. It returns the host disk the paused sandbox
// holds (0: unknown).
func (a *Agent) pause(ctx context.Context, key string) (int64, error) {
	a.reconcileMu.Lock()
	defer a.reconcileMu.Unlock()
	return a.pauseLocked(ctx, key)
}

// pauseLocked is pause; the caller holds reconcileMu.
func (a *Agent) pauseLocked(ctx context.Context, key string) (int64, error) {
	a.mu.Lock()
	b := a.boxes[key]
	switch {
	case b == nil:
		a.mu.Unlock()
		return 0, errdefs.NotFound("no sandbox %q on host %s", key, a.cfg.HostID)
	case b.rec.State != sandbox.Ready || b.sb == nil:
		a.mu.Unlock()
		return 0, errdefs.FailedPrecondition("sandbox %q is not ready (%s), so not paused", key, b.rec.State)
	case b.rec.Paused:
		disk := b.rec.PausedDiskBytes
		a.mu.Unlock()
		return disk, nil
	case b.inflight > 0:
		a.mu.Unlock()
		return 0, errdefs.Conflict("sandbox %q is running a command; not paused", key)
	}
	b.pausing = true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		b.pausing = false
		a.mu.Unlock()
	}()
	start := time.Now()
	drv := a.driverFor(b.rec.Ref)
	err := drv.Pause(ctx, b.rec.Ref)
	a.metrics.observeCheckpoint("pause", start, err)
	if err != nil {
		return 0, fmt.Errorf("pausing sandbox %s: %w", key, err)
	}
	// What it holds now is all it can hold until it resumes. Unmeasured,
	// its whole disk request stays reserved.
	var disk int64
	if m, ok := drv.(driver.DiskMeter); ok {
		if disk, err = m.DiskUsed(ctx, b.rec.Ref); err != nil {
			a.log.Warn("measuring a paused sandbox's disk; its whole disk request stays reserved", "session_id", key, "err", err)
			disk = 0
		}
	}
	// A crash before the record leaves a paused sandbox recorded running:
	// its next command resumes it (the driver's Exec does), and it stays
	// counted meanwhile.
	return disk, a.setPaused(b, true, disk)
}

// resumeIfPaused resumes key's sandbox if it is paused, once its CPU and
// memory fit in what is left on the host (else ResourceExhausted). One
// being paused is waited for and resumed: the agent pauses idle sandboxes
// by itself under memory pressure, and a command that comes meanwhile
// must not fail for it; one being paused under a fence (the control
// plane's idle pause) is not: use refuses the command, and the fence's
// holder decides.
func (a *Agent) resumeIfPaused(ctx context.Context, key string) error {
	a.mu.Lock()
	b := a.boxes[key]
	pausing := b != nil && !b.rec.Paused && b.pausing && !a.cfg.Now().Before(b.fencedUntil)
	paused := b != nil && b.rec.Paused || pausing
	a.mu.Unlock()
	if !paused {
		return nil // use says what else is wrong with it
	}
	if pausing {
		a.log.Info("a command waits for its sandbox's pause to end, to resume it", "session_id", key)
	}
	a.reconcileMu.Lock()
	defer a.reconcileMu.Unlock()
	a.mu.Lock()
	if b = a.boxes[key]; b == nil || !b.rec.Paused {
		a.mu.Unlock()
		return nil // destroyed or resumed meanwhile
	}
	spec := b.rec.Spec
	a.mu.Unlock()
	if err := a.checkCapacity(key, a.requestOf(b.rec.Request, spec.Limits)); err != nil {
		return fmt.Errorf("resuming paused sandbox %s: %w", key, err)
	}
	start := time.Now()
	err := a.driverFor(b.rec.Ref).Resume(ctx, b.rec.Ref)
	a.metrics.observeCheckpoint("resume", start, err)
	if err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", key, err)
	}
	return a.setPaused(b, false, 0)
}

// setPaused records b paused (holding disk bytes of the host's disk) or
// not. The caller holds reconcileMu.
func (a *Agent) setPaused(b *box, paused bool, disk int64) error {
	a.mu.Lock()
	rec := b.rec
	rec.Paused, rec.PausedDiskBytes = paused, disk
	rec.LastUsed = a.cfg.Now()
	a.mu.Unlock()
	if err := a.store.Put(rec); err != nil {
		return err
	}
	a.mu.Lock()
	b.rec.Paused, b.rec.PausedDiskBytes, b.rec.LastUsed = paused, disk, rec.LastUsed
	a.mu.Unlock()
	what := "resumed sandbox"
	if paused {
		what = "paused sandbox"
	}
	a.log.Info(what, "session_id", b.rec.Key, "id", b.rec.Ref.ID)
	return nil
}
