package server

import "corral.dev/corral/controlplane/fleet"

// Fleet is the node's fleet, for benchmarks that drive a drain directly
// and read each sandbox's DrainProgress.
func (s *Server) Fleet() *fleet.Fleet { return s.fleet }
