package policy

import (
	"fmt"
	"math"
)

// PricesFile is the optional policy file of models' list prices, which
// session budgets (the Managed Agents API's budget.max_list_cost) are
// measured in. A model without a price cannot run a session that has a
// budget: the API refuses it as model_not_budgetable.
const PricesFile = "prices.yaml"

// ModelPrice is a model's list price, in US dollars per million tokens of
// each kind.
type ModelPrice struct {
	Input      float64 `yaml:"input"`
	Output     float64 `yaml:"output"`
	CacheWrite float64 `yaml:"cache_write"`
	CacheRead  float64 `yaml:"cache_read"`
}

// NanosPerToken are a price's rates in billionths of a dollar per token
// ($1 per million tokens is 1000), rounded: integers, so that costs add up
// without rounding drift.
func (p ModelPrice) nanos() [4]int64 {
	r := func(v float64) int64 { return int64(math.Round(v * 1000)) }
	return [4]int64{r(p.Input), r(p.Output), r(p.CacheWrite), r(p.CacheRead)}
}

// CostNanos is the list cost, in billionths of a dollar, of the tokens.
func (p ModelPrice) CostNanos(input, output, cacheWrite, cacheRead int64) int64 {
	n := p.nanos()
	return input*n[0] + output*n[1] + cacheWrite*n[2] + cacheRead*n[3]
}

func (p ModelPrice) validate(model string) error {
	for _, v := range []float64{p.Input, p.Output, p.CacheWrite, p.CacheRead} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 1e6 {
			return fmt.Errorf("model_prices: %s: prices must be from 0 to 1000000 dollars per million tokens", model)
		}
	}
	return nil
}
