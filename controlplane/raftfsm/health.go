package raftfsm

import (
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
)

// CmdSetHostHealth records a change of a host's health.
const CmdSetHostHealth CommandType = "set_host_health" // HostHealthPayload

// SetHostHealth is the typed CmdSetHostHealth.
var SetHostHealth = Cmd[HostHealthPayload, scheduler.Host]{CmdSetHostHealth}

// HostHealthPayload changes a host's conditions and its providers'
// health. The leader proposes one only when what the host reports
// differs from the FSM's (never one per heartbeat), so that every replica
// filters placements on the same health.
//
// A condition replaces the host's condition of its type (others are
// kept); a provider's health replaces that of the host's offer of its
// name (a name the host did not register is ignored). Since is the
// proposer's: when the change was reported.
type HostHealthPayload struct {
	HostID     string                `json:"host_id"`
	Conditions []scheduler.Condition `json:"conditions,omitempty"`
	Providers  []ProviderHealth      `json:"providers,omitempty"`
}

// ProviderHealth is a provider's canary outcome on a host.
type ProviderHealth struct {
	Name    string `json:"name"`
	Healthy bool   `json:"healthy"`
	Reason  string `json:"reason,omitempty"`
	// Since is when the health changed to this.
	Since time.Time `json:"since,omitzero"`
}

func applySetHostHealth(f *FSM, _ uint64, p HostHealthPayload) (scheduler.Host, error) {
	h, ok := f.s.Hosts[p.HostID]
	if !ok {
		return scheduler.Host{}, errdefs.NotFound("host %s", p.HostID)
	}
	for _, c := range p.Conditions {
		if c.Type == "" {
			return scheduler.Host{}, errdefs.InvalidArgument("host %s: a condition needs a type", p.HostID)
		}
	}
	// Copy on write: a Read may hold the old slices.
	if len(p.Conditions) > 0 {
		conds := append([]scheduler.Condition(nil), h.Conditions...)
		for _, c := range p.Conditions {
			conds = setCondition(conds, c)
		}
		h.Conditions = conds
	}
	if len(p.Providers) > 0 {
		offers := append([]scheduler.Provider(nil), h.Offers...)
		for _, ph := range p.Providers {
			for i := range offers {
				if offers[i].Name == ph.Name {
					offers[i].Healthy, offers[i].Reason, offers[i].Since = ph.Healthy, ph.Reason, ph.Since
				}
			}
		}
		h.Offers = offers
	}
	f.index.Update(h)
	return *h, nil
}

// setCondition replaces the condition of c's type in conds, or adds it.
func setCondition(conds []scheduler.Condition, c scheduler.Condition) []scheduler.Condition {
	for i := range conds {
		if conds[i].Type == c.Type {
			conds[i] = c
			return conds
		}
	}
	return append(conds, c)
}
