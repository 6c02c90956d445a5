package api

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// FleetView reads the replicated fleet state (*raftfsm.Node).
type FleetView interface {
	// Read runs fn over this node's state (a stale read).
	Read(fn func(v raftfsm.View))
}

// HostAdmin changes hosts' records; controlplane/hosts implements it. Each
// returns once this node's state shows the change.
type HostAdmin interface {
	Register(ctx context.Context, h scheduler.Host) (scheduler.Host, error)
	Cordon(ctx context.Context, hostID string) (scheduler.Host, error)
	Uncordon(ctx context.Context, hostID string) (scheduler.Host, error)
}

// HostOps move or stop the sandboxes on hosts; controlplane/fleet
// implements them.
type HostOps interface {
	// StartDrain marks the host ineligible and records its drain in Raft,
	// for the leader to run (a host already draining keeps its drain).
	StartDrain(ctx context.Context, hostID string, o fleet.DrainOptions) (raftfsm.Drain, error)
	// WatchDrain calls fn with the host's drain and its steps after seq
	// whenever it changes, until it has finished (nil), is stopped, or
	// ctx ends.
	WatchDrain(ctx context.Context, hostID string, seq int, fn func(d raftfsm.Drain, steps []raftfsm.DrainStep)) error
	// Evict stops a session's sandbox and releases its placement.
	Evict(ctx context.Context, sessionID string) error
}

// SandboxAdmin places and releases sandboxes by hand; controlplane/fleet
// implements it.
type SandboxAdmin interface {
	Place(ctx context.Context, req scheduler.Request) (scheduler.Placement, error)
	Release(ctx context.Context, sessionID string) (scheduler.Placement, error)
}

// JoinTokens issues one-time host join tokens; controlplane/hosts
// implements it.
type JoinTokens interface {
	IssueToken(ctx context.Context, ttl time.Duration) (hostpki.JoinToken, error)
}

// DefaultJoinTokenTTL is a join token's lifetime when the request names none.
const DefaultJoinTokenTTL = time.Hour

// DefaultDrainDeadline is a drain's deadline when the request names none.
const DefaultDrainDeadline = 10 * time.Minute

// HostsService implements corral.admin.v1.HostsService.
type HostsService struct {
	adminv1.UnimplementedHostsServiceServer

	Fleet FleetView
	// Hosts registers, cordons and uncordons hosts. Required.
	Hosts HostAdmin
	// Ops drains hosts and evicts sandboxes; nil on a node built without
	// them, where those calls are Unimplemented.
	Ops HostOps
	// Tokens issues join tokens; nil: IssueJoinToken is Unimplemented.
	Tokens JoinTokens
}

var _ adminv1.HostsServiceServer = (*HostsService)(nil)

// ListHosts lists the hosts in this node's fleet state.
func (s *HostsService) ListHosts(context.Context, *adminv1.ListHostsRequest) (*adminv1.ListHostsResponse, error) {
	resp := &adminv1.ListHostsResponse{}
	s.Fleet.Read(func(v raftfsm.View) {
		count := map[string]int32{}
		for _, p := range v.Placements() {
			count[p.HostID]++
		}
		for _, h := range v.Hosts() {
			resp.Hosts = append(resp.Hosts, hostToProto(*h, count[h.ID]))
		}
	})
	return resp, nil
}

// RegisterHost records a host in the fleet state.
func (s *HostsService) RegisterHost(ctx context.Context, req *adminv1.RegisterHostRequest) (*adminv1.RegisterHostResponse, error) {
	ph := req.GetHost()
	if ph.GetId() == "" {
		return nil, errdefs.InvalidArgument("host.id is required")
	}
	out, err := s.Hosts.Register(ctx, scheduler.Host{
		ID: ph.GetId(), Status: scheduler.StatusReady, Eligible: true,
		Runtimes: ph.GetRuntimes(), Providers: ph.GetProviders(), Labels: ph.GetLabels(),
		Capacity: resourcesFromProto(ph.GetCapacity()),
	})
	if err != nil {
		return nil, err
	}
	return &adminv1.RegisterHostResponse{Host: hostToProto(out, 0)}, nil
}

// CordonHost makes a host ineligible for new placements.
func (s *HostsService) CordonHost(ctx context.Context, req *adminv1.CordonHostRequest) (*adminv1.CordonHostResponse, error) {
	h, err := s.setStatus(ctx, req.GetHostId(), s.Hosts.Cordon)
	if err != nil {
		return nil, err
	}
	return &adminv1.CordonHostResponse{Host: h}, nil
}

// UncordonHost makes a host eligible again and clears its drain mark.
func (s *HostsService) UncordonHost(ctx context.Context, req *adminv1.UncordonHostRequest) (*adminv1.UncordonHostResponse, error) {
	h, err := s.setStatus(ctx, req.GetHostId(), s.Hosts.Uncordon)
	if err != nil {
		return nil, err
	}
	return &adminv1.UncordonHostResponse{Host: h}, nil
}

func (s *HostsService) setStatus(ctx context.Context, id string, set func(context.Context, string) (scheduler.Host, error)) (*adminv1.Host, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("host_id is required")
	}
	if err := s.hostExists(id); err != nil {
		return nil, err
	}
	h, err := set(ctx, id)
	if err != nil {
		return nil, err
	}
	var n int32
	s.Fleet.Read(func(v raftfsm.View) { n = int32(v.PlacementCount(id)) })
	return hostToProto(h, n), nil
}

// DrainHost starts (or, with watch, follows) a host's drain through
// HostOps and streams its progress from the drain's Raft record: a step a
// message, or one message with the counts when there is no new step.
func (s *HostsService) DrainHost(req *adminv1.DrainHostRequest, stream grpc.ServerStreamingServer[adminv1.DrainHostResponse]) error {
	if req.GetHostId() == "" {
		return errdefs.InvalidArgument("host_id is required")
	}
	if req.GetWatch() && (req.GetDeadline() != nil || req.GetMaxParallel() != 0) {
		return errdefs.InvalidArgument("watch follows a running drain: it takes no deadline or max_parallel")
	}
	if err := s.hostExists(req.GetHostId()); err != nil {
		return err
	}
	if s.Ops == nil {
		return status.Error(codes.Unimplemented, "draining hosts is not available on this node: it runs without the host service")
	}
	ctx := stream.Context()
	if !req.GetWatch() {
		o := fleet.DrainOptions{Deadline: DefaultDrainDeadline, MaxParallel: int(req.GetMaxParallel())}
		if d := req.GetDeadline(); d != nil {
			if o.Deadline = d.AsDuration(); o.Deadline <= 0 {
				return errdefs.InvalidArgument("deadline must be positive, got %v", o.Deadline)
			}
		}
		if _, err := s.Ops.StartDrain(ctx, req.GetHostId(), o); err != nil {
			return err
		}
	}
	// The stream ends with the drain, or after the first message with
	// detach, or when a send fails; the drain goes on in every case.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var sendErr error
	send := func(d raftfsm.Drain, msg string, done bool) {
		if sendErr != nil {
			return
		}
		sendErr = stream.Send(&adminv1.DrainHostResponse{Moved: int32(d.Moved), MovedLive: int32(d.MovedLive), Evicted: int32(d.Evicted),
			Remaining: int32(d.Remaining()), Total: int32(d.Total), Deadline: timestamppb.New(d.Deadline), MaxParallel: int32(d.MaxParallel),
			Message: msg, Done: done})
	}
	detached := false
	err := s.Ops.WatchDrain(wctx, req.GetHostId(), 0, func(d raftfsm.Drain, steps []raftfsm.DrainStep) {
		for _, st := range steps {
			send(d, st.Message, false)
		}
		switch {
		case !d.Running():
			send(d, fmt.Sprintf("drained %s: %d moved (%d live), %d evicted", req.GetHostId(), d.Moved, d.MovedLive, d.Evicted), true)
		case len(steps) == 0:
			send(d, fmt.Sprintf("draining %s: %d of %d sandboxes left", req.GetHostId(), d.Remaining(), d.Total), false)
		}
		if sendErr != nil || req.GetDetach() {
			detached = sendErr == nil
			stop()
		}
	})
	switch {
	case sendErr != nil:
		return sendErr
	case detached:
		return nil
	}
	return err
}

// EvictSandbox evicts a session's sandbox through HostOps.
func (s *HostsService) EvictSandbox(ctx context.Context, req *adminv1.EvictSandboxRequest) (*adminv1.EvictSandboxResponse, error) {
	key := req.GetSessionId()
	if key == "" {
		return nil, errdefs.InvalidArgument("session_id is required")
	}
	var ok bool
	s.Fleet.Read(func(v raftfsm.View) { _, ok = v.Placement(key) })
	if !ok {
		return nil, errdefs.NotFound("session %s has no sandbox", key)
	}
	if s.Ops == nil {
		return nil, status.Error(codes.Unimplemented, "evicting sandboxes is not available on this node: it runs without the host service")
	}
	if err := s.Ops.Evict(ctx, key); err != nil {
		return nil, err
	}
	return &adminv1.EvictSandboxResponse{}, nil
}

// IssueJoinToken issues a one-time join token for a new host.
func (s *HostsService) IssueJoinToken(ctx context.Context, req *adminv1.IssueJoinTokenRequest) (*adminv1.IssueJoinTokenResponse, error) {
	if s.Tokens == nil {
		return nil, status.Error(codes.Unimplemented, "join tokens are not available on this node: it runs without the host service")
	}
	ttl := DefaultJoinTokenTTL
	if d := req.GetTtl(); d != nil {
		if ttl = d.AsDuration(); ttl <= 0 {
			return nil, errdefs.InvalidArgument("ttl must be positive, got %v", ttl)
		}
	}
	tok, err := s.Tokens.IssueToken(ctx, ttl)
	if err != nil {
		return nil, err
	}
	return &adminv1.IssueJoinTokenResponse{Token: tok.Reveal(), CaPin: tok.CAPin}, nil
}

// hostExists checks the host against this node's state.
func (s *HostsService) hostExists(id string) error {
	var ok bool
	s.Fleet.Read(func(v raftfsm.View) { _, ok = v.Host(id) })
	if !ok {
		return errdefs.NotFound("host %s does not exist", id)
	}
	return nil
}

// SandboxesService implements corral.admin.v1.SandboxesService.
type SandboxesService struct {
	adminv1.UnimplementedSandboxesServiceServer

	Fleet FleetView
	// Sandboxes places and releases sandboxes. Required.
	Sandboxes SandboxAdmin
}

var _ adminv1.SandboxesServiceServer = (*SandboxesService)(nil)

// PlaceSandbox places a session's sandbox.
func (s *SandboxesService) PlaceSandbox(ctx context.Context, req *adminv1.PlaceSandboxRequest) (*adminv1.PlaceSandboxResponse, error) {
	switch {
	case req.GetTenant() == "":
		return nil, errdefs.InvalidArgument("tenant is required")
	case req.GetSessionId() == "":
		return nil, errdefs.InvalidArgument("session_id is required")
	}
	p, err := s.Sandboxes.Place(ctx, scheduler.Request{
		SessionID: req.GetSessionId(), Tenant: req.GetTenant(), Runtime: req.GetRuntime(),
		Provider: req.GetProvider(), Image: req.GetImage(), Resources: resourcesFromProto(req.GetResources()),
	})
	if err != nil {
		return nil, err
	}
	return &adminv1.PlaceSandboxResponse{Sandbox: sandboxToProto(p)}, nil
}

// ListSandboxes lists placements from this node's state.
func (s *SandboxesService) ListSandboxes(_ context.Context, req *adminv1.ListSandboxesRequest) (*adminv1.ListSandboxesResponse, error) {
	resp := &adminv1.ListSandboxesResponse{}
	s.Fleet.Read(func(v raftfsm.View) {
		for _, p := range v.Placements() {
			if (req.GetHostId() == "" || p.HostID == req.GetHostId()) && (req.GetTenant() == "" || p.Tenant == req.GetTenant()) &&
				(req.GetSessionId() == "" || p.SessionID == req.GetSessionId()) {
				resp.Sandboxes = append(resp.Sandboxes, sandboxToProto(p))
			}
		}
		if id := req.GetSessionId(); id != "" {
			if r, ok := v.Runner(id); ok {
				resp.RunnerNodeId = r.NodeID
			}
		}
	})
	return resp, nil
}

// ReleaseSandbox drops a session's placement.
func (s *SandboxesService) ReleaseSandbox(ctx context.Context, req *adminv1.ReleaseSandboxRequest) (*adminv1.ReleaseSandboxResponse, error) {
	if req.GetSessionId() == "" {
		return nil, errdefs.InvalidArgument("session_id is required")
	}
	p, err := s.Sandboxes.Release(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	return &adminv1.ReleaseSandboxResponse{Sandbox: sandboxToProto(p)}, nil
}

func hostToProto(h scheduler.Host, sandboxes int32) *adminv1.Host {
	out := &adminv1.Host{
		Id: h.ID, Status: string(h.Status), Eligible: h.Eligible, Draining: h.Draining,
		Runtimes: h.Runtimes, Providers: h.Providers, Labels: h.Labels,
		Capacity: resourcesToProto(h.Capacity), Allocated: resourcesToProto(h.Allocated), Sandboxes: sandboxes,
		UnschedulableReasons: h.Unschedulable(),
	}
	out.Schedulable = len(out.UnschedulableReasons) == 0
	for _, p := range h.Offers {
		out.ProviderDetails = append(out.ProviderDetails, &adminv1.HostProvider{
			Name: p.Name, Isolation: p.Isolation, Platform: p.Platform, Checkpoint: p.Checkpoint,
			NetworkModes: p.NetworkModes, Gpu: p.GPU, Healthy: p.Healthy, Reason: p.Reason, Since: timeToProto(p.Since),
		})
	}
	for _, c := range h.Conditions {
		out.Conditions = append(out.Conditions, &adminv1.HostCondition{Type: c.Type, Ok: c.OK, Reason: c.Reason, Since: timeToProto(c.Since)})
	}
	return out
}

func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func sandboxToProto(p scheduler.Placement) *adminv1.Sandbox {
	return &adminv1.Sandbox{
		SessionId: p.SessionID, Tenant: p.Tenant, HostId: p.HostID, SandboxId: p.SandboxID, Resources: resourcesToProto(p.Resources),
		Runtime: p.Runtime, Provider: p.Provider, Ready: p.Ready,
	}
}

func resourcesToProto(r scheduler.Resources) *adminv1.Resources {
	return &adminv1.Resources{CpuMillis: r.CPUMillis, MemoryMib: r.MemoryMiB, DiskMib: r.DiskMiB}
}

func resourcesFromProto(r *adminv1.Resources) scheduler.Resources {
	return scheduler.Resources{CPUMillis: r.GetCpuMillis(), MemoryMiB: r.GetMemoryMib(), DiskMiB: r.GetDiskMib()}
}
