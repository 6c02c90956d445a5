// Package scheduler places sandboxes onto hosts. It is a pure function over a
// read-only fleet view: no database, no clock, no Raft and no gRPC (enforced by
// internal/archtest).
//
//	Request ──► Place(view, req, cfg) ──► Plan ──► leader: Admit(view, plan, quota) ──► commit
//	             filters: ready, eligible,           re-checks the plan against the
//	               not draining, healthy, pool,      state current at commit time
//	               runtime, provider, provider       (host still eligible, healthy and
//	               healthy, resources, tenant        in an allowed pool, capacity and
//	               share, labels                     tenant share still fit) and
//	             zone spread (when asked)
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
// Health drives placement: a host with a condition not OK (memory or disk
// pressure, containerd unreachable, no heartbeat for its TTL) or whose
// provider for the request fails its canary takes no new placements, by
// the same filters at planning and at commit; its existing placements
// stay. A request that names no provider asks for its runtime's.
//
// Host pools (pools.go): a host's pool is its "pool" label, and a request
// carries the pools its tenant may use (Request.ApplyPlacement, from
// policy), which its plan carries into the Raft log; the scheduler reads
// no policy, so a replica that re-plans or re-checks decides from the
// entry alone. Zone spread (Request.SpreadZones) ranks the hosts of the
// zones holding the fewest of the tenant's sandboxes above all others; a
// tenant's dedicated pools get an affinity above every other score.
//
// Indexes (index.go): a view that keeps an Index (Indexed; the FSM's
// does) files its schedulable hosts by pool and provider, and every host
// by zone, so Place looks only at the hosts of the request's pools that
// offer its provider: a placement costs O(candidates), not O(fleet). The
// filters, scores and tie-break are the same over the candidates, so the
// plan is the full scan's; only a request that fits nowhere scans every
// host, for its NoFitError. PlaceMove (move.go) plans a drain's or a lost
// host's move the same way, in a view without the moving placement.
//
// Place is idempotent per session key: a key the view already holds a placement
// for returns that placement. Plans computed concurrently from the same view may
// together overfill a host; the second one fails Validate with errdefs.Conflict
// and its caller plans again.
package scheduler
