// Package quota holds each tenant's limits: the defaults of
// policy/quotas.yaml overlaid with the tenant's overrides from the store,
// and the per-node request-rate token buckets built from them.
//
// Concurrent sessions are enforced in PostgreSQL at session create (see
// store.Sessions). Concurrent sandboxes, CPU and memory are enforced where
// sandboxes are placed, by the Raft FSM: SetQuota hands them to a
// SandboxQuotaSetter, which the server wires to it.
package quota

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// cacheTTL is how long a node uses a tenant's overrides before reading them
// again; an override set through this node applies at once.
const cacheTTL = 30 * time.Second

// Overrides reads the overrides of the tenant in ctx. store.Quotas
// implements it.
type Overrides interface {
	Get(ctx context.Context) (store.QuotaOverride, error)
}

// SandboxQuotaSetter receives a tenant's sandbox limits whenever they are
// set, for the component that enforces them at placement (the Raft FSM's
// CmdSetQuota). It must be idempotent.
type SandboxQuotaSetter interface {
	SetSandboxQuota(ctx context.Context, id tenant.ID, sandboxes, cpuMillis, memoryMiB int) error
}

// Quotas resolves limits and runs the request-rate buckets of one node.
type Quotas struct {
	defaults  policy.Quota
	overrides Overrides
	now       func() time.Time

	// mu guards tenants.
	mu      sync.Mutex
	tenants map[tenant.ID]*entry
}

type entry struct {
	q       policy.Quota
	read    time.Time
	limiter *rate.Limiter
}

// New returns Quotas over the policy's defaults. now may be nil (time.Now).
func New(defaults policy.Quota, overrides Overrides, now func() time.Time) *Quotas {
	if now == nil {
		now = time.Now
	}
	return &Quotas{defaults: defaults, overrides: overrides, now: now, tenants: map[tenant.ID]*entry{}}
}

// Defaults returns the policy's default limits.
func (q *Quotas) Defaults() policy.Quota { return q.defaults }

// Apply overlays o on the defaults.
func (q *Quotas) Apply(o store.QuotaOverride) policy.Quota {
	out := q.defaults
	set := func(dst *int, v *int32) {
		if v != nil {
			*dst = int(*v)
		}
	}
	set(&out.ConcurrentSessions, o.ConcurrentSessions)
	set(&out.ConcurrentSandboxes, o.ConcurrentSandboxes)
	set(&out.CPUMillis, o.CPUMillis)
	set(&out.MemoryMiB, o.MemoryMiB)
	set(&out.RequestsPerSecond, o.RequestsPerSecond)
	set(&out.RequestBurst, o.RequestBurst)
	set(&out.FileStorageMiB, o.FileStorageMiB)
	if o.ModelTokensPerDay != nil {
		out.ModelTokensPerDay = *o.ModelTokensPerDay
	}
	return out
}

// Effective returns tenant id's limits in force.
func (q *Quotas) Effective(ctx context.Context, id tenant.ID) (policy.Quota, error) {
	e, err := q.entry(ctx, id)
	if err != nil {
		return policy.Quota{}, err
	}
	return e.q, nil
}

// Forget drops what this node cached of tenant id's limits (after a
// SetQuota or a deletion).
func (q *Quotas) Forget(id tenant.ID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.tenants, id)
}

func (q *Quotas) entry(ctx context.Context, id tenant.ID) (*entry, error) {
	now := q.now()
	q.mu.Lock()
	e, ok := q.tenants[id]
	q.mu.Unlock()
	if ok && now.Sub(e.read) < cacheTTL {
		return e, nil
	}
	o, err := q.overrides.Get(tenant.With(ctx, id))
	if err != nil {
		return nil, fmt.Errorf("reading quota of %s: %w", id, err)
	}
	eff := q.Apply(o)
	q.mu.Lock()
	defer q.mu.Unlock()
	if cur, ok := q.tenants[id]; ok {
		// Keep the bucket's tokens; only its shape may change.
		cur.q, cur.read = eff, now
		cur.limiter.SetLimitAt(now, rate.Limit(eff.RequestsPerSecond))
		cur.limiter.SetBurstAt(now, eff.RequestBurst)
		return cur, nil
	}
	e = &entry{q: eff, read: now, limiter: rate.NewLimiter(rate.Limit(eff.RequestsPerSecond), eff.RequestBurst)}
	q.tenants[id] = e
	return e, nil
}

// Allow takes one request from tenant id's bucket, or returns a
// RateLimitedError saying when to retry.
func (q *Quotas) Allow(ctx context.Context, id tenant.ID) error {
	e, err := q.entry(ctx, id)
	if err != nil {
		return err
	}
	now := q.now()
	r := e.limiter.ReserveN(now, 1)
	if !r.OK() {
		return &RateLimitedError{Tenant: id, After: time.Second}
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return &RateLimitedError{Tenant: id, After: d}
	}
	return nil
}

// RateLimitedError is a request refused by its tenant's rate limit. Its
// kind is resource exhausted (HTTP 429); RetryAfter says when a retry will
// be let through.
type RateLimitedError struct {
	Tenant tenant.ID
	After  time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("tenant %s is over its request rate; retry after %ds", e.Tenant, e.RetryAfterSeconds())
}

// Unwrap gives the error its kind.
func (e *RateLimitedError) Unwrap() error { return errdefs.ResourceExhausted("rate limited") }

// RetryAfterSeconds is RetryAfter rounded up to whole seconds, at least 1
// (the unit of the retry-after header).
func (e *RateLimitedError) RetryAfterSeconds() int {
	return max(1, int(math.Ceil(e.After.Seconds())))
}
