package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"corral.dev/corral/hostagent/sandbox"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/metrics"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The agent's metrics live in a registry of its own (tests run several
// agents in one process), served on Config.MetricsAddr. What the agent
// holds (sandboxes by state, the warm pool) is read when scraped, from
// the same place heartbeats read it, so it is never stale; what happens
// (commands, pauses, checkpoints) is observed where it happens. No label
// carries a session key or tenant: hosts see many, and the control plane's
// metrics name tenants, behind its guard.

// Buckets for commands and checkpoints: milliseconds (an exec into a
// running sandbox) to minutes (a build, a large checkpoint).
var hostBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// hostMetrics are an agent's collectors.
type hostMetrics struct {
	reg *prometheus.Registry

	execDuration       *prometheus.HistogramVec
	checkpointDuration *prometheus.HistogramVec
	pressure           *prometheus.GaugeVec
}

func newHostMetrics(a *Agent) *hostMetrics {
	m := &hostMetrics{
		reg: metrics.NewRegistry(),
		execDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_host_exec_duration_seconds",
			Help:    "Time a command ran in a sandbox, by outcome (ok: exit 0, nonzero, timeout, canceled, error: it could not run).",
			Buckets: hostBuckets,
		}, []string{"outcome"}),
		checkpointDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "corral_host_checkpoint_duration_seconds",
			Help: "Time a checkpoint operation took, by operation (pause: checkpoint to disk, resume: restore from it, " +
				"export: send the checkpoint to another host, restore: take another host's checkpoint) and outcome (ok, error).",
			Buckets: hostBuckets,
		}, []string{"op", "outcome"}),
	}
	m.pressure = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "corral_host_pressure",
		Help: "1 while the host is under the condition (memory_pressure, disk_pressure) or could not check it, as of its last heartbeat; else 0.",
	}, []string{"condition"})
	m.reg.MustRegister(m.execDuration, m.checkpointDuration, m.pressure, stateCollector{a})
	return m
}

// observeExec records one command's end.
func (m *hostMetrics) observeExec(res *pb.ExecResult, err error, d time.Duration) {
	outcome := "ok"
	switch {
	case err != nil && errdefs.KindOf(err) == errdefs.CanceledKind:
		outcome = "canceled"
	case err != nil:
		outcome = "error"
	case res.TimedOut:
		outcome = "timeout"
	case res.ExitCode != 0:
		outcome = "nonzero"
	}
	m.execDuration.WithLabelValues(outcome).Observe(d.Seconds())
}

// observePressure records the pressure conditions a heartbeat reports.
func (m *hostMetrics) observePressure(conds []*pb.Condition) {
	for _, c := range conds {
		v := 0.0
		if !c.Ok {
			v = 1
		}
		m.pressure.WithLabelValues(c.Type).Set(v)
	}
}

// observeCheckpoint records one checkpoint operation that started at
// start; err is its outcome.
func (m *hostMetrics) observeCheckpoint(op string, start time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.checkpointDuration.WithLabelValues(op, outcome).Observe(time.Since(start).Seconds())
}

var (
	sandboxesDesc = prometheus.NewDesc("corral_host_sandboxes",
		"Sandboxes on this host, by state (ready, paused, evicted, failed) and provider (the driver's name, as heartbeats report it).",
		[]string{"state", "provider"}, nil)
	poolReadyDesc = prometheus.NewDesc("corral_host_warm_pool_ready",
		"Warm sandboxes ready to be claimed, by pool class and image.",
		[]string{"class", "image"}, nil)
	poolTargetDesc = prometheus.NewDesc("corral_host_warm_pool_target",
		"How many warm sandboxes the pool keeps ready now, by pool class and image.",
		[]string{"class", "image"}, nil)
	egressDesc = prometheus.NewDesc("corral_host_egress_connections_total",
		"Connections the sandboxes opened through this host's egress proxies, by verdict (allowed, denied).",
		[]string{"verdict"}, nil)
	egressDroppedDesc = prometheus.NewDesc("corral_host_egress_records_dropped_total",
		"Egress audit records the host dropped because its queue was full (each is counted in the next heartbeat too).",
		nil, nil)
)

// stateCollector reads the agent's sandboxes and warm pool at each scrape.
type stateCollector struct{ a *Agent }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- poolReadyDesc
	ch <- poolTargetDesc
	ch <- egressDesc
	ch <- egressDroppedDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ state, provider string }
	counts := map[key]int{}
	// Every state shows, at 0 when empty: a query need not tell "none" from
	// "not reported".
	for _, st := range []string{"ready", "paused", "evicted", "failed"} {
		for _, d := range c.a.drivers() {
			counts[key{st, d.Name()}] = 0
		}
	}
	c.a.mu.Lock()
	for _, b := range c.a.boxes {
		st := "ready"
		switch {
		case b.rec.State == sandbox.Evicted:
			st = "evicted"
		case b.rec.State == sandbox.Failed:
			st = "failed"
		case b.rec.Paused:
			st = "paused"
		}
		p := b.rec.Ref.Provider
		if p == "" {
			p = c.a.cfg.Driver.Name()
		}
		counts[key{st, p}]++
	}
	c.a.mu.Unlock()
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k.state, k.provider)
	}
	if c.a.nets != nil {
		t := c.a.nets.audit.Totals()
		ch <- prometheus.MustNewConstMetric(egressDesc, prometheus.CounterValue, float64(t.Allowed), "allowed")
		ch <- prometheus.MustNewConstMetric(egressDesc, prometheus.CounterValue, float64(t.Denied), "denied")
		ch <- prometheus.MustNewConstMetric(egressDroppedDesc, prometheus.CounterValue, float64(t.Dropped))
	}
	for _, p := range c.a.Pool() {
		class := className(p.Image, p.Limits)
		ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(p.Ready), class, p.Image)
		ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(p.Target), class, p.Image)
	}
}
