package hosts

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// stream is one connected host's Connect stream, on the leader.
type stream struct {
	hostID string
	kick   chan struct{} // capacity 1: reconcile soon
	cancel context.CancelFunc
	// deposed is set before cancel when this node stopped leading.
	deposed atomic.Bool

	// mu guards the fields below.
	mu sync.Mutex
	// reported is what the host holds: its latest heartbeat, updated by
	// assignment results since.
	reported map[string]pb.SandboxState
	// inflight maps a key to its unanswered assignment's id.
	inflight map[string]string
	pending  map[string]pendingAssignment // by assignment id
	// failed is when an ensure for a key last failed, to retry later.
	failed map[string]time.Time
	nextID int
	// warm is the warm pool counts of the latest heartbeat, by
	// scheduler.WarmKey; syncWarm records them in the FSM when they
	// differ from its.
	warm map[string]int
	// pauses are the host's pauses under pressure (paused.go).
	pauses pressurePauses
	// health is the latest heartbeat's (health.go), once healthSeen;
	// syncHealth records it in the FSM when it differs from its.
	health     reportedHealth
	healthSeen bool

	// egressAcked is the highest heartbeat seq whose egress is stored
	// (set by OnEgress's ack, from any goroutine); ackSent the highest
	// sent to the host in a HeartbeatAck (the stream's loop only).
	egressAcked atomic.Uint64
	ackSent     uint64
}

// ackEgress records that heartbeat seq's egress is stored, for the
// stream's loop to tell the host.
func (hs *stream) ackEgress(seq uint64) {
	for {
		cur := hs.egressAcked.Load()
		if seq <= cur || hs.egressAcked.CompareAndSwap(cur, seq) {
			break
		}
	}
	hs.kickNow()
}

type pendingAssignment struct {
	key    string
	ensure bool
}

// readyChange is a placement whose readiness in the FSM differs from what
// its host reports.
type readyChange = raftfsm.ReadyPayload

func (hs *stream) kickNow() {
	select {
	case hs.kick <- struct{}{}:
	default:
	}
}

// Connect serves one host's stream. Only the leader accepts it.
func (s *Service) Connect(st pb.HostService_ConnectServer) error {
	ctx := st.Context()
	id, err := hostpki.PeerName(ctx)
	if err != nil {
		return err
	}
	if !s.node.IsLeader() {
		return s.notLeader(st)
	}
	first, err := st.Recv()
	if err != nil {
		return err
	}
	reg := first.GetRegister()
	if reg == nil {
		return errdefs.InvalidArgument("the first message on Connect must be Register")
	}
	if reg.HostId != id {
		return errdefs.PermissionDenied("host certificate is for %q but Register says %q", id, reg.HostId)
	}
	h, err := hostFromRegister(reg, s.cfg.Overcommit, s.cfg.Now())
	if err != nil {
		return err
	}
	if _, err := raftfsm.Apply(ctx, s.node, raftfsm.RegisterHost, raftfsm.Key("register/"+id), h); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hs := &stream{hostID: id, kick: make(chan struct{}, 1), cancel: cancel, reported: reported(reg.Sandboxes),
		inflight: map[string]string{}, pending: map[string]pendingAssignment{}, failed: map[string]time.Time{}}
	s.mu.Lock()
	if old := s.streams[id]; old != nil {
		old.cancel() // the host reconnected; its old stream is dead
	}
	s.streams[id] = hs
	s.lastSeen[id] = s.cfg.Now()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.streams[id] == hs {
			delete(s.streams, id)
		}
		s.mu.Unlock()
	}()
	if err := s.catchUp(ctx); err != nil {
		if errdefs.KindOf(err) == errdefs.UnavailableKind {
			return s.notLeader(st)
		}
		return err
	}
	var (
		placed      []string
		schedulable scheduler.Resources
	)
	tenants := map[string]string{}
	s.node.Read(func(v raftfsm.View) {
		for _, p := range v.HostPlacements(id) {
			placed = append(placed, p.SessionID)
			tenants[p.SessionID] = p.Tenant
		}
		if h, ok := v.Host(id); ok {
			schedulable = h.Capacity
		}
	})
	s.placed.note(id, tenants, s.cfg.Now(), s.cfg.EgressGrace)
	if err := st.Send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_Registered{Registered: &pb.Registered{
		HeartbeatInterval: durationpb.New(s.cfg.HeartbeatInterval), PlacedKeys: placed,
		Schedulable: resourcesPB(schedulable), EgressAcks: true}}}); err != nil {
		return err
	}
	s.log.Info("host connected", "host_id", id, "sandboxes", len(reg.Sandboxes), "placed", len(placed), "address", reg.SandboxAddress)

	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch msg := m.Msg.(type) {
			case *pb.ConnectRequest_Heartbeat:
				s.onHeartbeat(hs, msg.Heartbeat)
			case *pb.ConnectRequest_Result:
				s.onResult(hs, msg.Result)
			}
		}
	}()
	hs.kickNow()
	for {
		select {
		case <-ctx.Done():
			switch {
			case hs.deposed.Load():
				return s.notLeader(st)
			case st.Context().Err() == nil:
				return errdefs.Unavailable("host %s opened a newer stream", id)
			}
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-hs.kick:
			if acked := hs.egressAcked.Load(); acked > hs.ackSent {
				if err := st.Send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_HeartbeatAck{HeartbeatAck: &pb.HeartbeatAck{Seq: acked}}}); err != nil {
					return err
				}
				hs.ackSent = acked
			}
			for _, as := range s.assignments(hs) {
				if err := st.Send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_Assignment{Assignment: as}}); err != nil {
					return err
				}
			}
			s.syncReady(ctx, hs)
			s.syncWarm(ctx, hs)
			s.syncHealth(ctx, hs)
			s.syncPressurePauses(ctx, hs)
			s.releaseEvicted(ctx, hs)
		}
	}
}

// catchUp makes sure this node, leading, has applied everything committed
// before its term (a Raft barrier, once per term): a new leader may lag its
// predecessor, and a host removes whatever Registered does not list.
func (s *Service) catchUp(ctx context.Context) error {
	s.mu.Lock()
	done := s.caughtUp
	s.mu.Unlock()
	if done {
		return nil
	}
	if err := s.node.ReadConsistent(ctx, func(raftfsm.View) {}); err != nil {
		return err
	}
	s.mu.Lock()
	s.caughtUp = true
	s.mu.Unlock()
	return nil
}

// notLeader refuses a stream on a follower, naming the leader's address.
func (s *Service) notLeader(st pb.HostService_ConnectServer) error {
	addr := s.leaderEndpoint()
	if addr != "" {
		st.SetTrailer(metadata.Pairs(hostpki.LeaderMetadataKey, addr))
	}
	return errdefs.Unavailable("control-plane node %s is not the leader; the leader's host service is at %q", s.node.ID(), addr)
}

func reported(sbs []*pb.SandboxStatus) map[string]pb.SandboxState {
	m := make(map[string]pb.SandboxState, len(sbs))
	for _, sb := range sbs {
		m[sb.Key] = sb.State
	}
	return m
}

// hostFromRegister is the host as the FSM records it: its capacity for
// placements is what it offers (its allocatable resources) times the
// overcommit ratios. The ratios are applied here, where a host's figures
// enter the FSM, and nowhere else: every replica stores the same figure
// (it is in the log), the scheduler and the quota read plain numbers, and
// the host is told the same figure for its own check. Eligibility and
// draining of a known host are kept by the FSM, as are its conditions
// until its first heartbeat.
func hostFromRegister(reg *pb.Register, o scheduler.Overcommit, now time.Time) (scheduler.Host, error) {
	offers, err := offersFromRegister(reg, now)
	if err != nil {
		return scheduler.Host{}, err
	}
	var providers []string
	for _, p := range offers {
		providers = append(providers, p.Name)
	}
	alloc := reg.Allocatable
	if alloc.GetCpuMillis() == 0 && alloc.GetMemoryBytes() == 0 && alloc.GetDiskBytes() == 0 {
		alloc = reg.Capacity
	}
	offered := scheduler.Resources{CPUMillis: alloc.GetCpuMillis(), MemoryMiB: alloc.GetMemoryBytes() >> 20, DiskMiB: alloc.GetDiskBytes() >> 20}
	return scheduler.Host{
		ID: reg.HostId, Status: scheduler.StatusReady, Eligible: true,
		Runtimes: reg.Runtimes, Providers: providers, Offers: offers,
		Capacity: o.Apply(offered), Offered: offered,
		Labels: reg.Labels, Images: reg.Images, Address: reg.SandboxAddress,
		Pausable: reg.Pausable,
	}, nil
}

func resourcesPB(r scheduler.Resources) *pb.Resources {
	return &pb.Resources{CpuMillis: r.CPUMillis, MemoryBytes: r.MemoryMiB << 20, DiskBytes: r.DiskMiB << 20}
}

// onHeartbeat records a heartbeat in memory (never through Raft).
func (s *Service) onHeartbeat(hs *stream, hb *pb.Heartbeat) {
	s.heartbeats.Add(1)
	s.mu.Lock()
	s.lastSeen[hs.hostID] = s.cfg.Now()
	s.mu.Unlock()
	hs.mu.Lock()
	hs.reported = reported(hb.Sandboxes)
	hs.warm = warmCounts(hb.WarmPools)
	hs.pauses.note(hb)
	hs.health, hs.healthSeen = healthFromHeartbeat(hb, s.cfg.Now()), true
	hs.mu.Unlock()
	if len(hb.Egress) > 0 || hb.EgressDropped > 0 {
		s.onEgress(hs, hb)
	}
	hs.kickNow()
}

// onEgress hands a heartbeat's egress records, those its placements vouch
// for, to OnEgress, whose ack the stream's loop tells the host. A
// heartbeat with nothing left to store is acknowledged at once.
func (s *Service) onEgress(hs *stream, hb *pb.Heartbeat) {
	recs, dropped := hb.Egress, max(0, hb.EgressDropped)
	if len(recs) > maxEgressPerHeartbeat {
		dropped += int64(len(recs) - maxEgressPerHeartbeat)
		recs = recs[:maxEgressPerHeartbeat]
	}
	recs = s.vouch(hs.hostID, recs)
	seq := hb.GetSeq()
	ack := func() {
		if seq > 0 {
			hs.ackEgress(seq)
		}
	}
	if s.cfg.OnEgress == nil {
		ack()
		return
	}
	s.cfg.OnEgress(hs.hostID, recs, dropped, ack)
}

// maxEgressPerHeartbeat bounds the egress records taken from one
// heartbeat (a host sends at most 512).
const maxEgressPerHeartbeat = 512

// warmCounts sums a heartbeat's warm pools by scheduler.WarmKey (classes
// that differ only in limits count together: the scheduler's warm score
// knows image and runtime).
func warmCounts(pools []*pb.WarmPool) map[string]int {
	m := map[string]int{}
	for _, p := range pools {
		if p.GetReady() > 0 && p.GetImage() != "" {
			m[scheduler.WarmKey(p.Image, p.Runtime)] += int(p.Ready)
		}
	}
	return m
}

// syncWarm records in the FSM the warm pool counts the host last reported,
// when they differ from the FSM's (the scheduler's warm score reads them
// there). A write that fails is tried again at the next kick.
func (s *Service) syncWarm(ctx context.Context, hs *stream) {
	hs.mu.Lock()
	warm := hs.warm
	hs.mu.Unlock()
	if warm == nil {
		return // no heartbeat yet
	}
	var cur map[string]int
	s.node.Read(func(v raftfsm.View) {
		if h, ok := v.Host(hs.hostID); ok {
			cur = h.Warm
		}
	})
	if maps.Equal(warm, cur) || len(warm) == 0 && len(cur) == 0 {
		return
	}
	if _, err := raftfsm.Apply(ctx, s.node, raftfsm.SetWarm, raftfsm.Key("warm/"+hs.hostID), raftfsm.WarmPayload{HostID: hs.hostID, Warm: warm}); err != nil && ctx.Err() == nil {
		s.log.Warn("recording a host's warm pool", "host_id", hs.hostID, "err", err)
	}
}

// onResult records an assignment's outcome.
func (s *Service) onResult(hs *stream, res *pb.AssignmentResult) {
	hs.mu.Lock()
	pa, ok := hs.pending[res.AssignmentId]
	if ok {
		delete(hs.pending, res.AssignmentId)
		if hs.inflight[pa.key] == res.AssignmentId {
			delete(hs.inflight, pa.key)
		}
		switch {
		case res.ErrorKind != "":
			if pa.ensure {
				hs.failed[pa.key] = s.cfg.Now()
			}
		case pa.ensure:
			hs.reported[pa.key] = res.Sandbox.GetState()
			delete(hs.failed, pa.key)
		default:
			delete(hs.reported, pa.key)
		}
	}
	hs.mu.Unlock()
	if ok && res.ErrorKind != "" {
		s.log.Warn("host refused an assignment", "host_id", hs.hostID, "session_id", pa.key, "kind", res.ErrorKind, "err", res.ErrorMessage)
	}
	hs.kickNow() // readiness to record, and keys that waited on this one
}

// syncReady records in the FSM which of the host's placements it reports
// ready: a sandbox with no assignment in flight that the host last
// reported READY. The fleet's waiters, on every node, watch the FSM for it,
// so no node probes hosts to learn readiness. A write that fails is tried
// again at the next kick (every heartbeat at the latest).
func (s *Service) syncReady(ctx context.Context, hs *stream) {
	var placed []scheduler.Placement
	s.node.Read(func(v raftfsm.View) { placed = v.HostPlacements(hs.hostID) })
	var changes []readyChange
	hs.mu.Lock()
	for _, p := range placed {
		st, ok := hs.reported[p.SessionID]
		ready := ok && st == pb.SandboxState_SANDBOX_STATE_READY && hs.inflight[p.SessionID] == ""
		if ready != p.Ready {
			changes = append(changes, readyChange{SessionID: p.SessionID, HostID: hs.hostID, SandboxID: p.SandboxID, Ready: ready})
		}
	}
	hs.mu.Unlock()
	for _, c := range changes {
		if _, err := raftfsm.Apply(ctx, s.node, raftfsm.SetReady, raftfsm.Key("ready/"+c.SandboxID), c); err != nil && ctx.Err() == nil && !errdefs.IsNotFound(err) {
			s.log.Warn("recording a sandbox's readiness", "host_id", hs.hostID, "session_id", c.SessionID, "ready", c.Ready, "err", err)
		}
	}
}

// releaseEvicted hands the placements whose sandboxes the host evicted to
// OnEvicted: an evicted sandbox holds no resources on its host, and its
// session must not wait for that host to have room again.
func (s *Service) releaseEvicted(ctx context.Context, hs *stream) {
	var placed []scheduler.Placement
	s.node.Read(func(v raftfsm.View) { placed = v.HostPlacements(hs.hostID) })
	var evicted []string
	hs.mu.Lock()
	for _, p := range placed {
		if hs.reported[p.SessionID] == pb.SandboxState_SANDBOX_STATE_EVICTED && hs.inflight[p.SessionID] == "" {
			evicted = append(evicted, p.SessionID)
		}
	}
	hs.mu.Unlock()
	for _, id := range evicted {
		s.cfg.OnEvicted(ctx, hs.hostID, id)
	}
}

// assignments computes what the host must do: ensure what is placed there
// and missing (or failed), destroy what is there and no longer placed. Keys with an
// unanswered assignment wait; a failed ensure is retried after half a
// heartbeat interval.
func (s *Service) assignments(hs *stream) []*pb.Assignment {
	var want []scheduler.Placement
	s.node.Read(func(v raftfsm.View) { want = v.HostPlacements(hs.hostID) })
	now := s.cfg.Now()
	// Every placement this host gets is seen here before its sandbox
	// exists, so that its egress records are vouched for even when it is
	// released before the next heartbeat.
	tenants := make(map[string]string, len(want))
	for _, p := range want {
		tenants[p.SessionID] = p.Tenant
	}
	s.placed.note(hs.hostID, tenants, now, s.cfg.EgressGrace)
	hs.mu.Lock()
	defer hs.mu.Unlock()
	var out []*pb.Assignment
	add := func(key string, ensure bool, as *pb.Assignment) {
		hs.nextID++
		as.Id = "as-" + strconv.Itoa(hs.nextID)
		hs.inflight[key] = as.Id
		hs.pending[as.Id] = pendingAssignment{key: key, ensure: ensure}
		out = append(out, as)
	}
	placed := make(map[string]bool, len(want))
	for _, p := range want {
		placed[p.SessionID] = true
		// A failed sandbox (lost while its agent was down) is ensured
		// again: the host replaces it and says so. An evicted one is not:
		// its placement is released (releaseEvicted), and the session's
		// next tool call places it anew.
		if st, ok := hs.reported[p.SessionID]; ok && st != pb.SandboxState_SANDBOX_STATE_FAILED || hs.inflight[p.SessionID] != "" {
			continue
		}
		if t, ok := hs.failed[p.SessionID]; ok && now.Sub(t) < s.cfg.HeartbeatInterval/2 {
			continue
		}
		add(p.SessionID, true, &pb.Assignment{Action: &pb.Assignment_Ensure{Ensure: &pb.EnsureSandbox{
			Key: p.SessionID, Image: p.Image, Runtime: p.Runtime,
			Limits:  limitsPB(p.LimitsOrRequest(), p.Pids),
			Request: resourcesPB(p.Resources),
			Tenant:  p.Tenant,
			// The host makes the sandbox's egress network for these.
			AllowedHosts: p.AllowedHosts,
		}}})
	}
	for key := range hs.reported {
		if placed[key] || hs.inflight[key] != "" {
			continue
		}
		add(key, false, &pb.Assignment{Action: &pb.Assignment_Destroy{Destroy: &pb.DestroySandbox{Key: key}}})
	}
	return out
}

// markDirty is the FSM's placement watcher: it runs under the FSM's lock,
// so it only records the host for the kick loop.
func (s *Service) markDirty(hostID string) {
	s.dirtyMu.Lock()
	if hostID == "" {
		s.dirtyAll = true
	} else {
		s.dirty[hostID] = true
	}
	s.dirtyMu.Unlock()
	select {
	case s.dirtyCh <- struct{}{}:
	default:
	}
}

// kickLoop makes the streams of hosts whose placements changed reconcile.
func (s *Service) kickLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.dirtyCh:
		}
		s.dirtyMu.Lock()
		dirty, all := s.dirty, s.dirtyAll
		s.dirty, s.dirtyAll = map[string]bool{}, false
		s.dirtyMu.Unlock()
		s.mu.Lock()
		for id, hs := range s.streams {
			if all || dirty[id] {
				hs.kickNow()
			}
		}
		s.mu.Unlock()
	}
}

// Heartbeats counts the heartbeats this node has received.
func (s *Service) Heartbeats() uint64 { return s.heartbeats.Load() }

// ConnectedHosts counts the hosts with a stream to this node.
func (s *Service) ConnectedHosts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// Connected reports whether a host has a stream to this node.
func (s *Service) Connected(hostID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[hostID] != nil
}

func limitsPB(l scheduler.Resources, pids int64) *pb.Limits {
	return &pb.Limits{CpuMillis: l.CPUMillis, MemoryBytes: l.MemoryMiB << 20, DiskBytes: l.DiskMiB << 20, Pids: pids}
}
