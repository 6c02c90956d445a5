package api

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/internal/errdefs"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Database is what the cluster service needs to know of the database.
type Database interface {
	// Ping reports whether the database answers now.
	Ping(ctx context.Context) error
	// SchemaVersion returns the database's schema version and the newest this
	// binary knows.
	SchemaVersion(ctx context.Context) (current, latest int64, err error)
}

// Membership is the node's Raft membership, as the cluster service needs it
// (*raftfsm.Node implements it).
type Membership interface {
	// Status describes this node and the members it knows.
	Status() (raftfsm.Status, error)
	// RemoveServer removes a node through the leader: errdefs.NotFound for
	// an unknown node, errdefs.FailedPrecondition for the last voter.
	RemoveServer(ctx context.Context, id string) error
}

// ClusterService implements corral.admin.v1.ClusterService.
type ClusterService struct {
	adminv1.UnimplementedClusterServiceServer

	NodeID    string
	Version   string
	StartedAt time.Time
	DB        Database
	// Raft is the node's cluster membership; nil on a node without Raft.
	Raft Membership
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

var _ adminv1.ClusterServiceServer = (*ClusterService)(nil)

// GetStatus describes this node.
func (s *ClusterService) GetStatus(ctx context.Context, _ *adminv1.GetStatusRequest) (*adminv1.GetStatusResponse, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	resp := &adminv1.GetStatusResponse{
		NodeId:    s.NodeID,
		Version:   s.Version,
		StartedAt: timestamppb.New(s.StartedAt),
		Uptime:    durationpb.New(now().Sub(s.StartedAt)),
	}
	if s.Raft != nil {
		st, err := s.Raft.Status()
		if err != nil {
			return nil, err
		}
		resp.RaftState, resp.LeaderId, resp.AppliedIndex = st.State, st.Leader, st.AppliedIndex
		resp.Members = membersToProto(st.Members)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.DB.Ping(pctx); err != nil {
		resp.DatabaseError = err.Error()
		return resp, nil
	}
	resp.DatabaseReachable = true
	cur, latest, err := s.DB.SchemaVersion(pctx)
	if err != nil {
		resp.DatabaseError = err.Error()
		return resp, nil
	}
	resp.SchemaVersion, resp.SchemaVersionLatest = cur, latest
	return resp, nil
}

// ListMembers lists the Raft configuration as this node knows it.
func (s *ClusterService) ListMembers(context.Context, *adminv1.ListMembersRequest) (*adminv1.ListMembersResponse, error) {
	if s.Raft == nil {
		return nil, errNoRaft
	}
	st, err := s.Raft.Status()
	if err != nil {
		return nil, err
	}
	return &adminv1.ListMembersResponse{Members: membersToProto(st.Members), LeaderId: st.Leader}, nil
}

// RemoveMember removes a node from the cluster through the leader.
func (s *ClusterService) RemoveMember(ctx context.Context, req *adminv1.RemoveMemberRequest) (*adminv1.RemoveMemberResponse, error) {
	if s.Raft == nil {
		return nil, errNoRaft
	}
	if req.GetNodeId() == "" {
		return nil, errdefs.InvalidArgument("node_id is required")
	}
	if err := s.Raft.RemoveServer(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	return &adminv1.RemoveMemberResponse{}, nil
}

var errNoRaft = errdefs.FailedPrecondition("this node runs without a Raft cluster")

func membersToProto(ms []raftfsm.MemberStatus) []*adminv1.Member {
	out := make([]*adminv1.Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, &adminv1.Member{NodeId: m.ID, RaftAddr: m.RaftAddr, RaftHttpAddr: m.HTTPAddr, Voter: m.Voter, Leader: m.Leader})
	}
	return out
}
