package publicapi

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkSessionCreate measures POST /v1/sessions end to end (HTTP,
// validation, agent and environment lookups, insert) on one node with
// PostgreSQL, and reports its latency percentiles.
func BenchmarkSessionCreate(b *testing.B) {
	a := setup(b, nil)
	agentID, envID := fixtures(b, a)
	body := map[string]any{"agent": agentID, "environment_id": envID, "title": "bench"}
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		a.ok("POST", "/v1/sessions", body)
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(float64(len(lat)-1)*p)].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
}
