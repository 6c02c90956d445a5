package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/metrics"
)

// fixedModel answers every request with the same usage.
type fixedModel struct{ usage model.Usage }

func (f fixedModel) Generate(context.Context, model.Request, model.DeltaFunc) (model.Response, error) {
	return model.Response{StopReason: "end_turn", Usage: f.usage}, nil
}

// Tenants and model names past the guard's limits are counted as "other":
// a tenant cannot grow the node's series without bound.
func TestModelTokensTenantLabelsAreBounded(t *testing.T) {
	m := newNodeMetrics()
	m.tenants, m.models = metrics.NewGuard(2), metrics.NewGuard(1)
	c := meteredModel{next: fixedModel{model.Usage{InputTokens: 10, OutputTokens: 3}}, m: m}
	for i := range 5 {
		ctx := tenant.With(context.Background(), tenant.ID(fmt.Sprintf("tenant_%d", i)))
		if _, err := c.Generate(ctx, model.Request{Model: fmt.Sprintf("model-%d", i%2)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	tokens := func(tn, mo, dir string) float64 {
		return testutil.ToFloat64(m.modelTokens.WithLabelValues(tn, mo, dir))
	}
	if got := tokens("tenant_0", "model-0", "input"); got != 10 {
		t.Errorf("tenant_0 input tokens = %v, want 10", got)
	}
	if got := tokens("tenant_1", metrics.Other, "output"); got != 3 {
		t.Errorf("tenant_1 output tokens on model other = %v, want 3", got)
	}
	// tenant_2..4: other; their models: model-0 (2, 4) and other (3).
	if got := tokens(metrics.Other, "model-0", "input") + tokens(metrics.Other, metrics.Other, "input"); got != 30 {
		t.Errorf("input tokens of tenants past the limit = %v, want 30", got)
	}
	if n := testutil.CollectAndCount(m.modelTokens); n > 3*2*2 {
		t.Errorf("%d token series, want at most (2 tenants + other) × (1 model + other) × 2 directions", n)
	}
}
