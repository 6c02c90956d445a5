package hosts

import (
	"context"

	"google.golang.org/grpc/credentials"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
)

// SandboxCredentials are the transport credentials for a host's
// SandboxService: mutual TLS with this node's control-plane certificate,
// the host's own name checked against the hosts' CA. The fleet dials with
// them.
func (s *Service) SandboxCredentials(hostID string) credentials.TransportCredentials {
	return credentials.NewTLS(hostpki.ClientTLS(s.ca.Cert, &s.cert, hostID))
}

// Register records a host through Raft (the admin API's RegisterHost, for
// hosts that run no agent). A known host keeps its eligibility, draining
// mark and allocation.
func (s *Service) Register(ctx context.Context, h scheduler.Host) (scheduler.Host, error) {
	if h.ID == "" {
		return scheduler.Host{}, errdefs.InvalidArgument("host.id is required")
	}
	return raftfsm.Apply(ctx, s.node, raftfsm.RegisterHost, raftfsm.Key("register_host/"+h.ID), h)
}

// Cordon makes a host ineligible for new placements.
func (s *Service) Cordon(ctx context.Context, hostID string) (scheduler.Host, error) {
	no := false
	return s.setStatus(ctx, "cordon", raftfsm.HostStatusPayload{ID: hostID, Eligible: &no})
}

// Uncordon makes a host eligible again and clears its drain mark.
func (s *Service) Uncordon(ctx context.Context, hostID string) (scheduler.Host, error) {
	yes, no := true, false
	return s.setStatus(ctx, "uncordon", raftfsm.HostStatusPayload{ID: hostID, Eligible: &yes, Draining: &no})
}

func (s *Service) setStatus(ctx context.Context, verb string, p raftfsm.HostStatusPayload) (scheduler.Host, error) {
	if p.ID == "" {
		return scheduler.Host{}, errdefs.InvalidArgument("host_id is required")
	}
	return raftfsm.Apply(ctx, s.node, raftfsm.SetHostStatus, raftfsm.Key(verb+"/"+p.ID), p)
}
