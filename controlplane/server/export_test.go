package server

import "corral.dev/corral/controlplane/fleet"

// FleetPorts are the node's session records as its fleet sees them.
func (s *Server) FleetPorts() (fleet.Sessions, fleet.Notices) {
	return sessionRecords{s.store}, notices{s.store}
}
