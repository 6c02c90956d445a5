package quota

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

type overrides struct {
	mu    sync.Mutex
	by    map[tenant.ID]store.QuotaOverride
	reads int
}

func (o *overrides) Get(ctx context.Context) (store.QuotaOverride, error) {
	id, _ := tenant.From(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reads++
	return o.by[id], nil
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestApply(t *testing.T) {
	def := policy.Quota{ConcurrentSessions: 10, ConcurrentSandboxes: 5, CPUMillis: 1000, MemoryMiB: 512, RequestsPerSecond: 50, RequestBurst: 100}
	q := New(def, &overrides{}, nil)
	three := int32(3)
	got := q.Apply(store.QuotaOverride{ConcurrentSandboxes: &three})
	want := def
	want.ConcurrentSandboxes = 3
	if got != want {
		t.Fatalf("Apply = %+v, want %+v", got, want)
	}
	if q.Apply(store.QuotaOverride{}) != def {
		t.Fatal("no overrides must give the defaults")
	}
}

func TestAllowIsPerTenant(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	two := int32(2)
	o := &overrides{by: map[tenant.ID]store.QuotaOverride{"tenant_a": {RequestsPerSecond: &two, RequestBurst: &two}}}
	q := New(policy.Quota{RequestsPerSecond: 100, RequestBurst: 100}, o, c.now)
	ctx := context.Background()
	for i := range 2 {
		if err := q.Allow(ctx, "tenant_a"); err != nil {
			t.Fatalf("request %d within the burst: %v", i, err)
		}
	}
	err := q.Allow(ctx, "tenant_a")
	var rl *RateLimitedError
	if !errors.As(err, &rl) || errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || rl.RetryAfterSeconds() != 1 {
		t.Fatalf("over the burst: %v", err)
	}
	// Another tenant is not affected by A's empty bucket.
	for i := range 50 {
		if err := q.Allow(ctx, "tenant_b"); err != nil {
			t.Fatalf("tenant_b request %d: %v", i, err)
		}
	}
	// Half a second refills one token at 2/s.
	c.t = c.t.Add(500 * time.Millisecond)
	if err := q.Allow(ctx, "tenant_a"); err != nil {
		t.Fatalf("after a refill: %v", err)
	}
	// Overrides are read once per cache period, then again.
	reads := o.reads
	_ = q.Allow(ctx, "tenant_a")
	if o.reads != reads {
		t.Fatal("overrides re-read within the cache period")
	}
	c.t = c.t.Add(cacheTTL)
	_ = q.Allow(ctx, "tenant_a")
	if o.reads != reads+1 {
		t.Fatal("overrides not re-read after the cache period")
	}
	// Forget applies a change at once.
	ten := int32(10)
	o.mu.Lock()
	o.by["tenant_a"] = store.QuotaOverride{RequestsPerSecond: &ten, RequestBurst: &ten}
	o.mu.Unlock()
	q.Forget("tenant_a")
	if e, _ := q.Effective(ctx, "tenant_a"); e.RequestBurst != 10 {
		t.Fatalf("after Forget: %+v", e)
	}
}
