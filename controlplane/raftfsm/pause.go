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
// is a conflict. Pausing frees the placement's CPU and memory on its host
// and moves it to its tenant's paused sandboxes; resuming takes them back,
// and is refused with errdefs.ResourceExhausted when the host has no room
// for them or the tenant's quota no room for one more running sandbox.
type PausePayload struct {
	SessionID string `json:"session_key"`
	HostID    string `json:"host_id"`
	SandboxID string `json:"sandbox_id"`
	Paused    bool   `json:"paused"`
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
	next.State = ""
	if p.Paused {
		next.State = scheduler.PlacementPaused
	} else {
		if h, ok := f.s.Hosts[cur.HostID]; ok {
			if need := next.Reserved().Sub(cur.Reserved()); !need.Within(h.Free()) {
				return cur, errdefs.ResourceExhausted("host %s has no room to resume the sandbox of session %s: it needs %+v, %+v is free", cur.HostID, p.SessionID, need, h.Free())
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
