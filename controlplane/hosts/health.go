package hosts

import (
	"context"
	"fmt"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// Health drives placement: a host's conditions and its providers' canary
// outcomes travel in its heartbeats, are kept in the leader's memory, and
// reach the FSM (which the scheduler reads on every replica) only when
// they change: SetHostHealth, proposed from the stream's kick loop. The
// time of a change is the heartbeat's check time.
//
// What a host says is bounded before it is kept: at most maxConditions
// conditions and maxProviders providers, names of at most maxNameBytes,
// reasons cut to maxReasonBytes.
const (
	maxConditions  = 16
	maxProviders   = 16
	maxNameBytes   = 64
	maxReasonBytes = 512
)

// reportedHealth is a host's health as its latest heartbeat said.
type reportedHealth struct {
	conditions []scheduler.Condition
	providers  []raftfsm.ProviderHealth
}

// healthFromHeartbeat bounds and converts a heartbeat's health; now is
// the time for a check that carries none.
func healthFromHeartbeat(hb *pb.Heartbeat, now time.Time) reportedHealth {
	var r reportedHealth
	for _, c := range hb.GetConditions() {
		if len(r.conditions) == maxConditions {
			break
		}
		if c.GetType() == "" || len(c.GetType()) > maxNameBytes || c.GetType() == scheduler.ConditionHeartbeat {
			continue // the heartbeat's condition is the control plane's
		}
		r.conditions = append(r.conditions, scheduler.Condition{Type: c.Type, OK: c.Ok, Reason: reason(c.Ok, c.Message), Since: at(c.GetCheckedAt().AsTime(), c.CheckedAt != nil, now)})
	}
	for _, p := range hb.GetProviders() {
		if len(r.providers) == maxProviders {
			break
		}
		if p.GetName() == "" || len(p.GetName()) > maxNameBytes {
			continue
		}
		r.providers = append(r.providers, raftfsm.ProviderHealth{Name: p.Name, Healthy: p.Ok, Reason: reason(p.Ok, p.Reason), Since: at(p.GetCheckedAt().AsTime(), p.CheckedAt != nil, now)})
	}
	return r
}

// offersFromRegister bounds and converts a Register's providers. A host
// that sends none offers one provider per runtime, as it always did (the
// scheduler counts a runtime as a provider of its name).
func offersFromRegister(reg *pb.Register, now time.Time) ([]scheduler.Provider, error) {
	if len(reg.GetProviders()) > maxProviders {
		return nil, errdefs.InvalidArgument("host %s registers %d providers, more than %d", reg.GetHostId(), len(reg.GetProviders()), maxProviders)
	}
	var out []scheduler.Provider
	for _, p := range reg.GetProviders() {
		if p.GetName() == "" || len(p.GetName()) > maxNameBytes {
			return nil, errdefs.InvalidArgument("host %s registers a provider named %q: names are 1 to %d bytes", reg.GetHostId(), textcut.Prefix(p.GetName(), maxNameBytes), maxNameBytes)
		}
		c, h := p.GetCapabilities(), p.GetHealth()
		modes := c.GetNetworkModes()
		if len(modes) > maxConditions {
			modes = modes[:maxConditions]
		}
		out = append(out, scheduler.Provider{
			Name: p.Name, Isolation: textcut.Prefix(c.GetIsolation(), maxNameBytes), Platform: textcut.Prefix(c.GetPlatform(), maxNameBytes),
			Checkpoint: c.GetCheckpoint(), NetworkModes: modes, GPU: c.GetGpu(),
			// Absent health is an older agent's: healthy, as it always was.
			Healthy: h == nil || h.Ok, Reason: reason(h == nil || h.Ok, h.GetReason()),
			Since: at(h.GetCheckedAt().AsTime(), h.GetCheckedAt() != nil, now),
		})
	}
	return out, nil
}

func reason(ok bool, s string) string {
	if ok {
		return ""
	}
	if s == "" {
		s = "failing (no reason given)"
	}
	return textcut.Prefix(s, maxReasonBytes)
}

func at(t time.Time, set bool, now time.Time) time.Time {
	if !set {
		return now
	}
	return t.UTC()
}

// healthChange is what of reported differs from the host's record, as a
// SetHostHealth payload, or false when nothing does. Only OK and reason
// count: a check time alone is no change.
func healthChange(h *scheduler.Host, reported reportedHealth) (raftfsm.HostHealthPayload, bool) {
	p := raftfsm.HostHealthPayload{HostID: h.ID}
	for _, c := range reported.conditions {
		if cur, ok := h.Condition(c.Type); !ok || cur.OK != c.OK || cur.Reason != c.Reason {
			p.Conditions = append(p.Conditions, c)
		}
	}
	for _, ph := range reported.providers {
		if cur, ok := h.Offer(ph.Name); ok && (cur.Healthy != ph.Healthy || cur.Reason != ph.Reason) {
			p.Providers = append(p.Providers, ph)
		}
	}
	return p, len(p.Conditions) > 0 || len(p.Providers) > 0
}

// syncHealth records in the FSM the health the host last reported, when
// it differs from the FSM's. A write that fails is tried again at the
// next kick (every heartbeat at the latest).
func (s *Service) syncHealth(ctx context.Context, hs *stream) {
	hs.mu.Lock()
	reported, ok := hs.health, hs.healthSeen
	hs.mu.Unlock()
	if !ok {
		return // no heartbeat yet
	}
	var (
		change  raftfsm.HostHealthPayload
		changed bool
	)
	s.node.Read(func(v raftfsm.View) {
		if h, ok := v.Host(hs.hostID); ok {
			change, changed = healthChange(h, reported)
		}
	})
	if !changed {
		return
	}
	if _, err := raftfsm.Apply(ctx, s.node, raftfsm.SetHostHealth, raftfsm.Key("health/"+hs.hostID), change); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("recording a host's health", "host_id", hs.hostID, "err", err)
		}
		return
	}
	for _, c := range change.Conditions {
		s.logHealth(hs.hostID, "condition", c.Type, c.OK, c.Reason)
	}
	for _, p := range change.Providers {
		s.logHealth(hs.hostID, "provider", p.Name, p.Healthy, p.Reason)
	}
}

func (s *Service) logHealth(hostID, what, name string, ok bool, why string) {
	if ok {
		s.log.Info("host health: "+what+" ok again; placements resume", "host_id", hostID, what, name)
		return
	}
	s.log.Warn("host health: "+what+" failing; no new placements", "host_id", hostID, what, name, "reason", why)
}

// heartbeatLost is the heartbeat condition of a host marked down.
func heartbeatLost(seen time.Time, ttl time.Duration) scheduler.Condition {
	return scheduler.Condition{Type: scheduler.ConditionHeartbeat, Reason: fmt.Sprintf("no heartbeat for more than %s (the host TTL)", ttl), Since: seen.UTC()}
}
