package server

import (
	"context"
	"time"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/internal/tracing"
)

// FleetPorts are the node's session records as its fleet sees them.
func (s *Server) FleetPorts() (fleet.Sessions, fleet.Notices) {
	return sessionRecords{s.store}, notices{s.store}
}

// TraceProvider is the node's tracer provider, nil with tracing off.
func (s *Server) TraceProvider() *tracing.Provider { return s.tracing }

// SweepOrphanBlobs runs the orphaned file blob sweep once, as the leader
// does every hour, taking the blobs modified before cutoff.
func (s *Server) SweepOrphanBlobs(ctx context.Context, cutoff time.Time) (int, error) {
	return s.orphans().sweep(ctx, cutoff)
}
