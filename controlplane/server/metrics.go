package server

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/metrics"
)

// A node's metrics live in a registry of its own (tests run several nodes
// in one process) and are served on Config.MetricsAddr. Every metric here
// is updated by a hook this file wires into the part that sees the event:
// the HTTP handler's observer, the event streams' gauge, and decorators
// around the loop's ports (tools, model), which stay free of Prometheus.
//
// Label values a tenant chooses (its id, an agent's model name) pass a
// cardinality guard: the first maxTenantLabels tenants and maxModelLabels
// models keep their own series, the rest count as "other".

const (
	maxTenantLabels = 200
	maxModelLabels  = 50
	maxToolLabels   = 50 // built-in tool names are ours, but the guard costs nothing
)

// Buckets for work that takes from milliseconds to minutes: a tool call
// (bash runs up to its timeout), a model call (a long answer streams for
// minutes).
var slowBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// nodeMetrics are a node's collectors.
type nodeMetrics struct {
	reg *prometheus.Registry

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	sseStreams   prometheus.Gauge
	grpcRequests *prometheus.CounterVec
	grpcDuration *prometheus.HistogramVec

	loopSteps *prometheus.HistogramVec

	toolCalls    *prometheus.CounterVec
	toolDuration *prometheus.HistogramVec

	modelDuration *prometheus.HistogramVec
	modelTokens   *prometheus.CounterVec

	// The usage meter's counters (controlplane/usage): tokens as the
	// model client sees them, sandbox seconds as the leader's meter
	// accrues them (registered by watchMeter).
	usageTokens  *prometheus.CounterVec
	usageSandbox *prometheus.CounterVec

	placements        *prometheus.CounterVec
	placementDuration *prometheus.HistogramVec

	raftApply         *prometheus.HistogramVec
	raftLeaderChanges prometheus.Counter

	egressRejected *prometheus.CounterVec

	tenants, models, tools *metrics.Guard
}

func newNodeMetrics() *nodeMetrics {
	m := &nodeMetrics{
		reg: metrics.NewRegistry(),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_http_requests_total",
			Help: "HTTP requests served by the REST listener, by route pattern and status code.",
		}, []string{"route", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_http_request_duration_seconds",
			Help:    "Time to serve an HTTP request, by route pattern (an event stream: how long it stayed open).",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		grpcRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_grpc_requests_total",
			Help: "Admin gRPC calls (the REST gateway's under /admin/ included), by full method name and status code.",
		}, []string{"method", "code"}),
		grpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_grpc_request_duration_seconds",
			Help:    "Time to serve an admin gRPC call (a stream: how long it stayed open), by full method name.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method"}),
		sseStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "corral_sse_streams",
			Help: "Session event streams (Server-Sent Events) open now.",
		}),
		loopSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_loop_step_duration_seconds",
			Help:    "Steps of session loops on this node, by the action taken (call_model, run_tools, start_turn, end_turn, block, consume_only, wait, invalid); a step's time includes its model or tool calls.",
			Buckets: slowBuckets,
		}, []string{"action"}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_tool_calls_total",
			Help: "Built-in tool calls run in sessions' sandboxes, by tool and outcome (ok, error: the tool reported an error, failed: it could not run, canceled).",
		}, []string{"tool", "outcome"}),
		toolDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_tool_call_duration_seconds",
			Help:    "Time a built-in tool call took, by tool and outcome.",
			Buckets: slowBuckets,
		}, []string{"tool", "outcome"}),
		modelDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_model_request_duration_seconds",
			Help:    "Time a model request took, by model and outcome (ok, error, canceled).",
			Buckets: slowBuckets,
		}, []string{"model", "outcome"}),
		modelTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_model_tokens_total",
			Help: "Tokens of model requests, by tenant, model and direction (input, output, cache_read, cache_creation).",
		}, []string{"tenant", "model", "direction"}),
		usageTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_usage_model_tokens_total",
			Help: "Model tokens metered for billing, by tenant, model and kind (input, output, cache_read, cache_creation); the record is the admin API's usage report.",
		}, []string{"tenant", "model", "kind"}),
		usageSandbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_usage_sandbox_seconds_total",
			Help: "Seconds sessions' sandboxes spent running or paused, by tenant and state, accrued by the Raft leader's meter (other nodes add nothing); the record is the admin API's usage report.",
		}, []string{"tenant", "state"}),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_placements_total",
			Help: "Placements of sessions' sandboxes asked of this node (moves not included), by outcome (placed, existing, no_capacity, refused, unavailable, canceled, error).",
		}, []string{"outcome"}),
		placementDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_placement_duration_seconds",
			Help:    "Time to place a session's sandbox: the scheduler's plan and its commit through Raft, by outcome.",
			Buckets: prometheus.DefBuckets,
		}, []string{"outcome"}),
		raftApply: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_raft_apply_duration_seconds",
			Help:    "Time to commit a Raft command through this node, as its caller waits for it (forwarding to the leader and retries included), by command type and outcome (ok, error).",
			Buckets: prometheus.DefBuckets,
		}, []string{"command", "outcome"}),
		raftLeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_raft_leader_changes_total",
			Help: "Changes of Raft leader (to another node, or to none) this node observed.",
		}),
		egressRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_egress_records_rejected_total",
			Help: "Egress audit records a host sent that this node did not store, by reason: not_placed (the session is not, nor was within the grace, placed on that host), tenant_mismatch (the record names another tenant than the placement's).",
		}, []string{"reason"}),
		tenants: metrics.NewGuard(maxTenantLabels),
		models:  metrics.NewGuard(maxModelLabels),
		tools:   metrics.NewGuard(maxToolLabels),
	}
	m.reg.MustRegister(m.httpRequests, m.httpDuration, m.grpcRequests, m.grpcDuration, m.sseStreams, m.loopSteps, m.toolCalls, m.toolDuration, m.modelDuration, m.modelTokens,
		m.usageTokens, m.placements, m.placementDuration, m.raftApply, m.raftLeaderChanges, m.egressRejected)
	return m
}

// grpcInterceptors count the admin gRPC server's calls. They go first in
// the chain, so a call refused by authentication counts with its code.
// Methods are the services' own (an unknown one never reaches an
// interceptor).
func (m *nodeMetrics) grpcInterceptors() []grpc.ServerOption {
	observe := func(method string, err error, start time.Time) {
		m.grpcRequests.WithLabelValues(method, status.Code(err).String()).Inc()
		m.grpcDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			start := time.Now()
			resp, err := handler(ctx, req)
			observe(info.FullMethod, err, start)
			return resp, err
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			start := time.Now()
			err := handler(srv, ss)
			observe(info.FullMethod, err, start)
			return err
		}),
	}
}

// observeStep is the agent loop's step observer.
func (m *nodeMetrics) observeStep(action string, d time.Duration) {
	m.loopSteps.WithLabelValues(action).Observe(d.Seconds())
}

// observePlace is the fleet's placement observer.
func (m *nodeMetrics) observePlace(outcome string, d time.Duration) {
	m.placements.WithLabelValues(outcome).Inc()
	m.placementDuration.WithLabelValues(outcome).Observe(d.Seconds())
}

// observeEgressRejected is the host service's observer of rejected egress
// records. Reasons are the hosts package's, a fixed set.
func (m *nodeMetrics) observeEgressRejected(reason string, n int) {
	m.egressRejected.WithLabelValues(reason).Add(float64(n))
}

// observeApply is the Raft node's apply observer. Command types are ours,
// a fixed set.
func (m *nodeMetrics) observeApply(cmd raftfsm.CommandType, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.raftApply.WithLabelValues(string(cmd), outcome).Observe(d.Seconds())
}

// watchLeader adds a gauge of whether this node leads now, read at each
// scrape.
func (m *nodeMetrics) watchLeader(isLeader func() bool) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "corral_raft_leader",
		Help: "1 while this node is the Raft leader, else 0.",
	}, func() float64 {
		if isLeader() {
			return 1
		}
		return 0
	}))
}

// observeSandbox is the usage meter's observer.
func (m *nodeMetrics) observeSandbox(t tenant.ID, state string, d time.Duration) {
	m.usageSandbox.WithLabelValues(m.tenants.Value(string(t)), state).Add(d.Seconds())
}

// watchMeter registers the sandbox seconds, which flush (the meter's
// Flush) brings up to now before each scrape.
func (m *nodeMetrics) watchMeter(flush func()) {
	m.reg.MustRegister(flushing{Collector: m.usageSandbox, flush: flush})
}

// flushing is a collector that flushes what it collects first.
type flushing struct {
	prometheus.Collector
	flush func()
}

// Collect implements prometheus.Collector.
func (f flushing) Collect(ch chan<- prometheus.Metric) {
	f.flush()
	f.Collector.Collect(ch)
}

// observeHTTP is the HTTP handler's observer.
func (m *nodeMetrics) observeHTTP(pattern string, status int, d time.Duration) {
	if pattern == "" {
		pattern = "unmatched"
	}
	m.httpRequests.WithLabelValues(pattern, strconv.Itoa(status)).Inc()
	m.httpDuration.WithLabelValues(pattern).Observe(d.Seconds())
}

// meteredTools counts the loop's built-in tool calls.
type meteredTools struct {
	next interface {
		agentloop.Toolbox
		agentloop.ToolCanceler
	}
	m *nodeMetrics
}

var (
	_ agentloop.Toolbox      = meteredTools{}
	_ agentloop.ToolCanceler = meteredTools{}
)

// Run implements agentloop.Toolbox. Each try counts: the loop retries a
// transient failure, and each try took its time.
func (t meteredTools) Run(ctx context.Context, sessionID string, call agentloop.ToolCall) (agentloop.ToolResult, error) {
	start := time.Now()
	res, err := t.next.Run(ctx, sessionID, call)
	outcome := "ok"
	switch {
	case err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
		outcome = "canceled"
	case err != nil:
		outcome = "failed"
	case res.IsError:
		outcome = "error"
	}
	tool := t.m.tools.Value(call.Name)
	t.m.toolCalls.WithLabelValues(tool, outcome).Inc()
	t.m.toolDuration.WithLabelValues(tool, outcome).Observe(time.Since(start).Seconds())
	return res, err
}

// CancelTool implements agentloop.ToolCanceler.
func (t meteredTools) CancelTool(ctx context.Context, sessionID string, call agentloop.ToolCall) error {
	return t.next.CancelTool(ctx, sessionID, call)
}

// meteredModel times model requests and counts their tokens.
type meteredModel struct {
	next model.Client
	m    *nodeMetrics
}

var _ model.Client = meteredModel{}

// Generate implements model.Client. The loop's context carries the
// session's tenant.
func (c meteredModel) Generate(ctx context.Context, req model.Request, onDelta model.DeltaFunc) (model.Response, error) {
	start := time.Now()
	resp, err := c.next.Generate(ctx, req, onDelta)
	outcome := "ok"
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = "canceled"
	case err != nil:
		outcome = "error"
	}
	name := c.m.models.Value(req.Model)
	c.m.modelDuration.WithLabelValues(name, outcome).Observe(time.Since(start).Seconds())
	if err == nil {
		t, _ := tenant.From(ctx)
		tn := c.m.tenants.Value(string(t))
		for _, u := range []struct {
			direction string
			n         int64
		}{
			{"input", resp.Usage.InputTokens},
			{"output", resp.Usage.OutputTokens},
			{"cache_read", resp.Usage.CacheReadInputTokens},
			{"cache_creation", resp.Usage.CacheCreationInputTokens},
		} {
			if u.n > 0 {
				c.m.modelTokens.WithLabelValues(tn, name, u.direction).Add(float64(u.n))
				c.m.usageTokens.WithLabelValues(tn, name, u.direction).Add(float64(u.n))
			}
		}
	}
	return resp, err
}
