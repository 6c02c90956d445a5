package api

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

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

// ClusterService implements corral.admin.v1.ClusterService.
type ClusterService struct {
	adminv1.UnimplementedClusterServiceServer

	NodeID    string
	Version   string
	StartedAt time.Time
	DB        Database
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
