package hosts

import (
	"context"
	"maps"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Pauses under pressure
//
// A host short of memory pauses idle sandboxes by itself (hostagent/agent,
// pressure.go) and says so in its next heartbeat (Heartbeat.pressure_pauses).
// The leader records each in the FSM with SetPaused, as the fleet's idle
// pause does: the placement's CPU and memory are freed on its host, the
// tenant's sandbox counts as paused, and the session's next tool call finds
// the placement paused and resumes it through the FSM (which checks the
// host's room and the tenant's quota) like any paused sandbox. The FSM stays
// the record of what each placement holds; the host only reports.
//
// A pause is recorded once. It is dropped unrecorded when the placement is
// gone, on another host or already paused, and when the host's latest
// heartbeat no longer reports the sandbox paused (a command came first and
// resumed it); while a mover fences the placement it waits. A write that
// fails is tried again at the next kick. A pause reported to a leader that
// lost its leadership before recording it is lost: the placement keeps
// holding its CPU and memory (the safe side) until its next pause. A
// command that resumes the sandbox on its host after the heartbeat that
// reported the pause and before the record leaves the placement recorded
// paused while the sandbox runs (its CPU and memory uncounted) until the
// session's next tool call, which resumes it through the FSM (the host
// answers that resume at once).

// pressurePauses is what a host's heartbeats said of its pauses under
// pressure; guarded by its stream's mu.
type pressurePauses struct {
	// pending are the pauses not yet recorded, by key.
	pending map[string]*pb.PressurePause
	// paused are the sandboxes the latest heartbeat reports paused.
	paused map[string]bool
}

// note takes in a heartbeat.
func (pp *pressurePauses) note(hb *pb.Heartbeat) {
	pp.paused = map[string]bool{}
	for _, sb := range hb.Sandboxes {
		if sb.Paused {
			pp.paused[sb.Key] = true
		}
	}
	for _, p := range hb.PressurePauses {
		if pp.pending == nil {
			pp.pending = map[string]*pb.PressurePause{}
		}
		pp.pending[p.Key] = p
	}
}

// syncPressurePauses records in the FSM the pauses under pressure the host
// reported (see above).
func (s *Service) syncPressurePauses(ctx context.Context, hs *stream) {
	hs.mu.Lock()
	pending, paused := maps.Clone(hs.pauses.pending), hs.pauses.paused
	hs.mu.Unlock()
	now := s.cfg.Now()
	for key, pp := range pending {
		var (
			p  scheduler.Placement
			ok bool
		)
		s.node.Read(func(v raftfsm.View) { p, ok = v.Placement(key) })
		done := true
		switch {
		case !ok || p.HostID != hs.hostID || p.Paused():
		case !paused[key]:
			s.log.Info("a sandbox paused under pressure was resumed before its pause was recorded", "host_id", hs.hostID, "session_id", key)
		case p.Fence.Holds(now):
			done = false // after its mover
		default:
			_, err := raftfsm.Apply(ctx, s.node, raftfsm.SetPaused, raftfsm.Key("pressure-pause/"+key),
				raftfsm.PausePayload{SessionID: key, HostID: hs.hostID, SandboxID: p.SandboxID, Paused: true, DiskMiB: raftfsm.DiskMiB(pp.GetDiskBytes())})
			switch {
			case err == nil:
				s.log.Info("recorded a sandbox its host paused under pressure", "host_id", hs.hostID, "session_id", key, "reason", pp.Reason)
			case errdefs.IsNotFound(err), errdefs.IsConflict(err): // released or moved meanwhile
			default:
				done = false
				if ctx.Err() == nil {
					s.log.Warn("recording a sandbox its host paused under pressure", "host_id", hs.hostID, "session_id", key, "err", err)
				}
			}
		}
		if done {
			hs.mu.Lock()
			if hs.pauses.pending[key] == pp {
				delete(hs.pauses.pending, key)
			}
			hs.mu.Unlock()
		}
	}
}
