package hosts

import (
	"context"
	"time"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
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
// grace period) and has the placements on down hosts moved (OnHostDown).
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
	var (
		down     []string
		lastSeen = map[string]time.Time{}
	)
	s.mu.Lock()
	if now.Sub(s.leaderSince) >= s.cfg.LeaderGrace {
		for _, id := range ready {
			seen, ok := s.lastSeen[id]
			if !ok {
				seen = s.leaderSince
			}
			if now.Sub(seen) > s.cfg.HostTTL {
				down, lastSeen[id] = append(down, id), seen
			}
		}
	}
	s.mu.Unlock()
	for _, id := range down {
		// The reason first: an operator who sees the host down sees why.
		if _, err := raftfsm.Apply(ctx, s.node, raftfsm.SetHostHealth, raftfsm.Key("health/"+id),
			raftfsm.HostHealthPayload{HostID: id, Conditions: []scheduler.Condition{heartbeatLost(lastSeen[id], s.cfg.HostTTL)}}); err != nil {
			s.log.Warn("recording a silent host's heartbeat condition", "host_id", id, "err", err)
		}
		st := scheduler.StatusDown
		if _, err := raftfsm.Apply(ctx, s.node, raftfsm.SetHostStatus, raftfsm.Key("down/"+id), raftfsm.HostStatusPayload{ID: id, Status: &st}); err != nil {
			s.log.Warn("marking a silent host down", "host_id", id, "err", err)
			continue
		}
		s.log.Warn("host marked down", "host_id", id, "ttl", s.cfg.HostTTL)
		orphaned = append(orphaned, id)
	}
	for _, id := range orphaned {
		s.cfg.OnHostDown(ctx, id)
	}
}
