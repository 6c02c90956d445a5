// Package metrics is what both daemons share for Prometheus: a registry of
// their own (never the global one, so tests run several servers and hosts
// in one process), the handler that serves it on /metrics, the metrics
// listener, and the cardinality guard that bounds label values a tenant
// controls.
//
// Each daemon declares its metrics beside the code that updates them and
// registers them here; packages that must stay free of Prometheus take
// small hooks instead.
package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry with the Go runtime and process
// collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg's metrics in the text exposition format, on GET
// /metrics only.
func Handler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		MaxRequestsInFlight: 4, // a scrape is cheap, but nobody needs many at once
		Timeout:             10 * time.Second,
	}))
	return mux
}

// Listener is a daemon's metrics listener: /metrics only, plaintext or TLS.
type Listener struct {
	ln  net.Listener
	srv *http.Server
	tls bool
}

// Listen takes addr for reg's metrics. tlsConfig, when set, makes it serve
// TLS.
func Listen(addr string, reg *prometheus.Registry, tlsConfig *tls.Config, log *slog.Logger) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	return &Listener{ln: ln, tls: tlsConfig != nil, srv: &http.Server{
		Handler:           Handler(reg, log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		TLSConfig:         tlsConfig,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}, nil
}

// Addr is the address the listener is bound to.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// URL is the listener's /metrics URL.
func (l *Listener) URL() string {
	scheme := "http"
	if l.tls {
		scheme = "https"
	}
	return scheme + "://" + l.Addr() + "/metrics"
}

// Serve serves until Close; it returns nil after Close.
func (l *Listener) Serve() error {
	var err error
	if l.tls {
		err = l.srv.ServeTLS(l.ln, "", "")
	} else {
		err = l.srv.Serve(l.ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving within ctx's time, then drops what is left.
func (l *Listener) Close(ctx context.Context) {
	if err := l.srv.Shutdown(ctx); err != nil {
		_ = l.srv.Close()
	}
	_ = l.ln.Close()
}

// Other is the label value a Guard gives every value past its limit.
const Other = "other"

// Guard bounds the distinct values one label takes (tenant ids, model
// names: what tenants choose), so that a tenant cannot grow the metrics
// without bound: the first Limit values seen keep their own series, every
// later one is counted as Other. The zero Guard passes nothing through;
// make one with NewGuard.
type Guard struct {
	limit int
	mu    sync.Mutex
	// seen holds the values admitted so far; guarded by mu.
	seen map[string]struct{}
}

// NewGuard returns a guard that admits up to limit distinct values.
func NewGuard(limit int) *Guard {
	return &Guard{limit: limit, seen: make(map[string]struct{}, limit)}
}

// Value is v when v is one of the first limit values seen (or is seen
// while there is room), and Other beyond. An empty v is "none".
func (g *Guard) Value(v string) string {
	if v == "" {
		return "none"
	}
	if g == nil {
		return Other
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.seen[v]; ok {
		return v
	}
	if len(g.seen) >= g.limit {
		return Other
	}
	g.seen[v] = struct{}{}
	return v
}

// IsLoopback reports whether addr (host:port, or a bare host) names only
// this machine: "localhost", 127.0.0.0/8 or ::1. An empty host or an
// unspecified address (all interfaces) is not loopback, nor is any other
// name (what it resolves to may change). Metrics name tenants and
// sessions' load, so a daemon serves them beyond loopback only when told.
func IsLoopback(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
