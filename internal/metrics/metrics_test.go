package metrics

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestGuard(t *testing.T) {
	g := NewGuard(3)
	for i := range 3 {
		if got, want := g.Value(fmt.Sprint("t", i)), fmt.Sprint("t", i); got != want {
			t.Fatalf("value %d: got %q, want %q", i, got, want)
		}
	}
	for i := 3; i < 100; i++ {
		if got := g.Value(fmt.Sprint("t", i)); got != Other {
			t.Fatalf("value %d past the limit: got %q, want %q", i, got, Other)
		}
	}
	if got := g.Value("t1"); got != "t1" {
		t.Errorf("a value admitted before: got %q, want t1", got)
	}
	if got := g.Value(""); got != "none" {
		t.Errorf("empty: got %q, want none", got)
	}
	var nilGuard *Guard
	if got := nilGuard.Value("t0"); got != Other {
		t.Errorf("nil guard: got %q, want %q", got, Other)
	}
}

func TestListenerServesMetricsOnly(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "corral_test_total", Help: "A test counter."})
	reg.MustRegister(c)
	c.Inc()
	l, err := Listen("127.0.0.1:0", reg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.Close(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	code, body := get(l.URL())
	if code != http.StatusOK || !strings.Contains(body, "corral_test_total 1") || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_") {
		t.Errorf("GET /metrics: %d, want 200 with the test counter, go_ and process_ metrics:\n%.2000s", code, body)
	}
	if code, _ := get("http://" + l.Addr() + "/"); code != http.StatusNotFound {
		t.Errorf("GET /: %d, want 404", code)
	}
}
