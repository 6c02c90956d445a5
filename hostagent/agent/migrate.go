package agent

import (
	"fmt"
	"io"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Live moves, as the host's two ends see them (the control plane drives
// them; controlplane/fleet's drain):
//
//	source: Fence ── Pause ── ExportCheckpoint, ExportWorkspace ──▶ blob store
//	target: (ensured as any sandbox) ── ImportWorkspace ── RestoreCheckpoint
//	        (its own init stops; it runs restored from the image)
//
// Only a driver that can (driver.Migrator, CanMigrate nil) takes part; the
// host says so in Register.pausable.

// migrator is the first of the host's drivers that is a driver.Migrator
// able to move sandboxes live, or nil when none of this host's sandboxes
// can.
func (a *Agent) migrator() driver.Migrator {
	for _, d := range a.drivers() {
		if m, ok := d.(driver.Migrator); ok && m.CanMigrate() == nil {
			return m
		}
	}
	return nil
}

// needMigrator is d as a driver.Migrator, or why its sandboxes cannot move
// live; d nil asks whether any of the host's can (the default runtime's
// driver answers why not).
func (a *Agent) needMigrator(d driver.Driver) (driver.Migrator, error) {
	if d == nil {
		if m := a.migrator(); m != nil {
			return m, nil
		}
		d = a.cfg.Driver
	}
	m, ok := d.(driver.Migrator)
	if !ok {
		return nil, errdefs.Unimplemented("host %s: the %s driver cannot move sandboxes live", a.cfg.HostID, d.Name())
	}
	if err := m.CanMigrate(); err != nil {
		return nil, fmt.Errorf("host %s: %w", a.cfg.HostID, err)
	}
	return m, nil
}

// ExportCheckpoint implements SandboxService.ExportCheckpoint.
func (s *sandboxServer) ExportCheckpoint(req *pb.ExportCheckpointRequest, stream pb.SandboxService_ExportCheckpointServer) error {
	if _, err := s.a.needMigrator(nil); err != nil {
		return err
	}
	_, done, err := s.a.useFenced(req.Key) // a mover exports a fenced sandbox
	if err != nil {
		return err
	}
	defer done()
	s.a.mu.Lock()
	b := s.a.boxes[req.Key]
	ref, paused := b.rec.Ref, b.rec.Paused
	s.a.mu.Unlock()
	m, err := s.a.needMigrator(s.a.driverFor(ref))
	if err != nil {
		return err
	}
	if !paused {
		return errdefs.FailedPrecondition("sandbox %q on host %s is not paused: pause it before exporting its checkpoint", req.Key, s.a.cfg.HostID)
	}
	w := &chunkStream{send: func(b []byte) error { return stream.Send(&pb.ExportCheckpointResponse{Data: b}) }}
	start := time.Now()
	n, err := m.ExportCheckpoint(stream.Context(), ref, w)
	s.a.metrics.observeCheckpoint("export", start, err)
	if err != nil {
		return fmt.Errorf("exporting the checkpoint of %s: %w", req.Key, err)
	}
	if err := w.flush(); err != nil {
		return err
	}
	s.a.log.Info("exported a sandbox's checkpoint", "session_id", req.Key, "bytes", n)
	return nil
}

// RestoreCheckpoint implements SandboxService.RestoreCheckpoint.
func (s *sandboxServer) RestoreCheckpoint(stream pb.SandboxService_RestoreCheckpointServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if _, err := s.a.needMigrator(nil); err != nil {
		return err
	}
	a, key := s.a, first.Key
	a.mu.Lock()
	b := a.boxes[key]
	switch {
	case key == "":
		a.mu.Unlock()
		return errdefs.InvalidArgument("restore: a sandbox key is required")
	case b == nil:
		a.mu.Unlock()
		return errdefs.NotFound("no sandbox %q on host %s", key, a.cfg.HostID)
	case b.rec.State != sandbox.Ready || b.sb == nil || b.evicting:
		a.mu.Unlock()
		return errdefs.FailedPrecondition("sandbox %q on host %s is not ready, so not restored", key, a.cfg.HostID)
	case b.rec.Paused || b.pausing:
		a.mu.Unlock()
		return errdefs.FailedPrecondition("sandbox %q on host %s is paused: a checkpoint restores into a running sandbox", key, a.cfg.HostID)
	case b.inflight > 0 || b.restoring:
		a.mu.Unlock()
		return errdefs.Conflict("sandbox %q on host %s is in use; not restored", key, a.cfg.HostID)
	}
	m, err := a.needMigrator(a.driverFor(b.rec.Ref)) // its runtime's
	if err != nil {
		a.mu.Unlock()
		return err
	}
	// Busy meanwhile: no pause, eviction or call takes it.
	b.restoring = true
	b.inflight++
	ref := b.rec.Ref
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		b.restoring = false
		b.inflight--
		b.rec.LastUsed = a.cfg.Now()
		if b.inflight == 0 && b.idle != nil {
			close(b.idle)
			b.idle = nil
		}
		a.mu.Unlock()
	}()
	r := &countReader{r: &recvReader{buf: first.Data, recv: func() ([]byte, error) {
		msg, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return msg.Data, nil
	}}}
	start := a.cfg.Now()
	took := time.Now()
	err = m.RestoreCheckpoint(stream.Context(), ref, r, driver.CheckpointLimits{})
	a.metrics.observeCheckpoint("restore", took, err)
	if err != nil {
		return fmt.Errorf("restoring sandbox %s from a checkpoint: %w", key, err)
	}
	a.log.Info("restored a sandbox from another host's checkpoint", "session_id", key, "id", ref.ID, "bytes", r.n, "duration", a.cfg.Now().Sub(start))
	return stream.SendAndClose(&pb.RestoreCheckpointResponse{Bytes: r.n})
}

// countReader counts what it reads.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
