package raftfsm

import (
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
)

// CmdSetPaused records that a placement's sandbox was paused on its host,
// or is to be resumed there.
const CmdSetPaused CommandType = "set_paused" // PausePayload

// SetPaused is the typed CmdSetPaused.
var SetPaused = Cmd[PausePayload, scheduler.Placement]{CmdSetPaused}

// PausePayload pauses (Paused) or resumes a session's placement. It names
// the sandbox (host and sandbox id): a placement since moved or replaced
// is a conflict. Pausing frees the placement's CPU and memory on its host,
// and its disk beyond what the host measured the paused sandbox holds,
// and moves it to its tenant's paused sandboxes; resuming takes them back,
// and is refused with errdefs.ResourceExhausted when the host has no room
// for them or the tenant's quota no room for one more running sandbox.
type PausePayload struct {
	SessionID string `json:"session_key"`
	HostID    string `json:"host_id"`
	SandboxID string `json:"sandbox_id"`
	Paused    bool   `json:"paused"`
	// DiskMiB is what the paused sandbox holds of its host's disk, as
	// the host measured it (Placement.PausedDiskMiB; 0: not measured).
	DiskMiB int64 `json:"disk_mib,omitempty"`
}

// DiskMiB is bytes of disk in whole MiB, rounded up.
func DiskMiB(bytes int64) int64 {
	if bytes <= 0 {
		return 0
	}
	return (bytes + 1<<20 - 1) >> 20
}

func applySetPaused(f *FSM, _ uint64, p PausePayload) (scheduler.Placement, error) {
	cur, ok := f.s.Placements[p.SessionID]
	switch {
	case !ok:
		return cur, errdefs.NotFound("placement for session %s", p.SessionID)
	case cur.HostID != p.HostID || cur.SandboxID != p.SandboxID:
		return cur, errdefs.Conflict("the sandbox of session %s is now %s on host %s, not %s on %s", p.SessionID, cur.SandboxID, cur.HostID, p.SandboxID, p.HostID)
	case cur.Paused() == p.Paused:
		return cur, nil
	}
	next := cur
	next.State, next.PausedDiskMiB = "", 0
	if p.Paused {
		next.State, next.PausedDiskMiB = scheduler.PlacementPaused, max(p.DiskMiB, 0)
	} else {
		if h, ok := f.s.Hosts[cur.HostID]; ok {
			// What the paused sandbox holds beyond its disk request (a
			// checkpoint as large as its memory) is given back, not needed,
			// however full the disk.
			need, free := next.Reserved().Sub(cur.Reserved()), h.Free()
			if need.DiskMiB <= 0 {
				need.DiskMiB, free.DiskMiB = 0, max(free.DiskMiB, 0)
			}
			if !need.Within(free) {
				return cur, errdefs.ResourceExhausted("host %s has no room to resume the sandbox of session %s: it needs %+v, %+v is free", cur.HostID, p.SessionID, need, free)
			}
		}
		if err := scheduler.CheckQuota(cur.Tenant, f.usage[cur.Tenant], f.quota(cur.Tenant), cur.Resources); err != nil {
			return cur, err
		}
	}
	f.unplace(cur)
	f.place(next)
	return next, nil
}
