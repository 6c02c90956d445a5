// Package metricstest scrapes a daemon's /metrics in tests and reads values
// from what it parsed, as a Prometheus server would see them.
package metricstest

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one scrape of url, parsed, by metric name.
type Scrape map[string]*dto.MetricFamily

// Get scrapes url over HTTP and parses the text exposition format; any
// failure fails the test.
func Get(t testing.TB, url string) Scrape {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: status %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

// Value is the value of the series of name whose labels include labels:
// a counter's or gauge's value, a histogram's sample count. A series that
// is not there is 0 (as a counter that never moved), and ok false.
// Several matching series are summed.
func (s Scrape) Value(name string, labels map[string]string) (v float64, ok bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if !match(m, labels) {
			continue
		}
		ok = true
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Histogram != nil:
			v += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			v += m.GetUntyped().GetValue()
		}
	}
	return v, ok
}

// LabelValues lists the values label takes in the series of name.
func (s Scrape) LabelValues(name, label string) []string {
	var out []string
	for _, m := range s[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out = append(out, l.GetValue())
			}
		}
	}
	return out
}

func match(m *dto.Metric, labels map[string]string) bool {
	for k, want := range labels {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k {
				found = l.GetValue() == want
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
