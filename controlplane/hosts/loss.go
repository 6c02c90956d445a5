package hosts

import (
	"context"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
)

// leaderPoll is how often the timer loop looks at whether this node leads.
const leaderPoll = 50 * time.Millisecond

// leaderLoop tracks leadership: while this node leads it checks the hosts
// every quarter TTL; while it does not, it ends any host stream it holds
// (a host connected just before an election), pointing it at the leader.
func (s *Service) leaderLoop(ctx context.Context) {
	t := time.NewTicker(leaderPoll)
	defer t.Stop()
	checkEvery := max(s.cfg.HostTTL/4, leaderPoll)
	var lastCheck time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		leading, now := s.node.IsLeader(), s.cfg.Now()
		s.mu.Lock()
		if leading && !s.leading {
			// Heartbeats went to the old leader: every host starts afresh,
			// with LeaderGrace to reconnect.
			s.leaderSince, s.lastSeen, s.caughtUp = now, map[string]time.Time{}, false
			for id := range s.streams {
				s.lastSeen[id] = now
			}
			s.log.Info("leading: host timers start", "grace", s.cfg.LeaderGrace, "ttl", s.cfg.HostTTL)
		}
		s.leading = leading
		if !leading {
			// Streams belong on the leader: end any here, with a hint.
			for _, hs := range s.streams {
				hs.deposed.Store(true)
				hs.cancel()
			}
		}
		s.mu.Unlock()
		if leading && now.Sub(lastCheck) >= checkEvery {
			lastCheck = now
			s.checkHosts(ctx, now)
		}
	}
}

// checkHosts marks down the hosts not heard from for HostTTL (outside the
// grace period) and moves the placements off down hosts.
func (s *Service) checkHosts(ctx context.Context, now time.Time) {
	var ready, orphaned []string
	s.node.Read(func(v raftfsm.View) {
		for _, h := range v.Hosts() {
			switch {
			case h.Status != scheduler.StatusDown:
				ready = append(ready, h.ID)
			case v.PlacementCount(h.ID) > 0:
				orphaned = append(orphaned, h.ID)
			}
		}
	})
	var down []string
	s.mu.Lock()
	if now.Sub(s.leaderSince) >= s.cfg.LeaderGrace {
		for _, id := range ready {
			seen, ok := s.lastSeen[id]
			if !ok {
				seen = s.leaderSince
			}
			if now.Sub(seen) > s.cfg.HostTTL {
				down = append(down, id)
			}
		}
	}
	s.mu.Unlock()
	for _, id := range down {
		st := scheduler.StatusDown
		if err := s.apply(ctx, raftfsm.CmdSetHostStatus, raftfsm.Key("down/"+id), raftfsm.HostStatusPayload{ID: id, Status: &st}, nil); err != nil {
			s.log.Warn("marking a silent host down", "host_id", id, "err", err)
			continue
		}
		s.log.Warn("host marked down", "host_id", id, "ttl", s.cfg.HostTTL)
		orphaned = append(orphaned, id)
	}
	for _, id := range orphaned {
		s.reschedule(ctx, id)
	}
}

// reschedule moves every placement off a down host and tells OnRescheduled.
// What cannot move now (no host fits) is tried again at the next check.
func (s *Service) reschedule(ctx context.Context, hostID string) {
	var ps []scheduler.Placement
	s.node.Read(func(v raftfsm.View) { ps = v.HostPlacements(hostID) })
	for _, p := range ps {
		pl, err := s.move(ctx, hostID, p)
		if err != nil {
			s.log.Warn("rescheduling a sandbox off a down host", "host_id", hostID, "session", p.SessionKey, "err", err)
			continue
		}
		s.log.Info("sandbox rescheduled", "session", p.SessionKey, "from", hostID, "to", pl.HostID)
		if s.cfg.OnRescheduled != nil {
			s.cfg.OnRescheduled(ctx, p.Tenant, p.SessionKey, hostID, pl.HostID)
		}
	}
}

// move places a session elsewhere and moves its placement off from in one
// Raft command, planning again when the plan was stale.
func (s *Service) move(ctx context.Context, from string, p scheduler.Placement) (scheduler.Placement, error) {
	req := scheduler.Request{SessionKey: p.SessionKey, Tenant: p.Tenant, Runtime: p.Runtime, Provider: p.Provider,
		Resources: p.Resources, Image: p.Image}
	const attempts = 5
	for i := 1; ; i++ {
		var (
			plan scheduler.Plan
			err  error
		)
		s.node.Read(func(v raftfsm.View) { plan, err = scheduler.Place(without{v, p.SessionKey}, req, s.cfg.Scheduler) })
		if err != nil {
			return scheduler.Placement{}, err
		}
		var pl scheduler.Placement
		// A plan back onto from means this node has not yet applied the
		// host's change of status: the leader refuses it as a conflict.
		err = s.apply(ctx, raftfsm.CmdMovePlacement, raftfsm.Key("move/"+p.SessionKey),
			raftfsm.MovePayload{SessionKey: p.SessionKey, From: from, Plan: plan}, &pl)
		if !errdefs.IsConflict(err) || i == attempts {
			return pl, err
		}
		if err := pause(ctx, time.Duration(i)*20*time.Millisecond); err != nil {
			return scheduler.Placement{}, err
		}
	}
}

// without is a view in which a session is not placed, for planning its
// move.
type without struct {
	scheduler.View
	key string
}

func (w without) Placement(key string) (scheduler.Placement, bool) {
	if key == w.key {
		return scheduler.Placement{}, false
	}
	return w.View.Placement(key)
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
