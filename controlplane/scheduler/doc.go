// Package scheduler places sandboxes onto hosts. It is a pure function over a
// read-only fleet view: no database, no clock, no Raft and no gRPC (enforced by
// internal/archtest).
//
//	Request ──► Place(view, req, cfg) ──► Plan ──► leader: Admit(view, plan, quota) ──► commit
//	             filters: ready, eligible,           re-checks the plan against the
//	               not draining, runtime,            state current at commit time
//	               provider, resources, labels       (host still eligible, capacity
//	             scores: warm sandbox, image,        still fits) and the tenant quota
//	               bin-pack or spread, affinity
//	             tie-break: lowest host id
//
// Place is idempotent per session key: a key the view already holds a placement
// for returns that placement. Plans computed concurrently from the same view may
// together overfill a host; the second one fails Validate with errdefs.Conflict
// and its caller plans again.
package scheduler
