// Package scheduler places sandboxes onto hosts. It is a pure function over a
// read-only fleet view: no database, no clock, no Raft and no gRPC (enforced by
// internal/archtest).
//
//	Request ──► Place(view, req, cfg) ──► Plan ──► leader: Admit(view, plan, quota) ──► commit
//	             filters: ready, eligible,           re-checks the plan against the
//	               not draining, runtime,            state current at commit time
//	               provider, resources,              (host still eligible, capacity
//	               tenant share, labels              and tenant share still fit) and
//	             scores: warm sandbox, image,        the tenant quota
//	               bin-pack or spread, affinity
//	             tie-break: lowest host id
//
// A placement reserves its request (Resources), which is small, and
// carries its limits (Limits), which its host's cgroup enforces. A host's
// Capacity is what it offers times the overcommit ratios (Overcommit), so
// idle sandboxes, which use next to nothing, share a host; a tenant's
// placements reserve at most its quota's HostSharePercent of any host, so
// one tenant's sessions, idle or not, never take a whole host.
//
// Place is idempotent per session key: a key the view already holds a placement
// for returns that placement. Plans computed concurrently from the same view may
// together overfill a host; the second one fails Validate with errdefs.Conflict
// and its caller plans again.
package scheduler
