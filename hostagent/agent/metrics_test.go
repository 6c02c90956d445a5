package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/metrics/metricstest"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// The agent's /metrics shows its sandboxes by state and provider, and the
// commands, pauses and resumes it ran, each scraped over HTTP and parsed
// as Prometheus would. (The fake driver keeps no warm pool: the gVisor
// test below checks the pool's gauges.)
func TestAgentMetrics(t *testing.T) {
	e := setup(t)
	e.metricsAddr = "127.0.0.1:0"
	r := e.start()
	defer r.stop()
	url := r.a.MetricsURL()
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("MetricsURL %q", url)
	}
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	if out, res, err := execStream(t, c, "s1", "echo", "one"); err != nil || res.ExitCode != 0 || out != "one\n" {
		t.Fatalf("exec: %q %v %v", out, res, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Pause(ctx, &pb.PauseRequest{Key: "s1"}); err != nil {
		t.Fatal(err)
	}
	m := metricstest.Get(t, url)
	gauge := func(m metricstest.Scrape, state string) float64 {
		v, _ := m.Value("corral_host_sandboxes", map[string]string{"state": state})
		return v
	}
	if gauge(m, "paused") != 1 || gauge(m, "ready") != 0 {
		t.Errorf("paused: corral_host_sandboxes paused=%v ready=%v, want 1 and 0", gauge(m, "paused"), gauge(m, "ready"))
	}
	// The next command resumes it.
	if out, _, err := execStream(t, c, "s1", "echo", "two"); err != nil || out != "two\n" {
		t.Fatalf("exec after the pause: %q %v", out, err)
	}

	m = metricstest.Get(t, url)
	if gauge(m, "ready") != 1 || gauge(m, "paused") != 0 {
		t.Errorf("resumed: corral_host_sandboxes ready=%v paused=%v, want 1 and 0", gauge(m, "ready"), gauge(m, "paused"))
	}
	if v, _ := m.Value("corral_host_sandboxes", map[string]string{"state": "ready", "provider": "fake"}); v != 1 {
		t.Errorf("corral_host_sandboxes{state=ready,provider=fake} = %v, want 1 (providers: %v)", v, m.LabelValues("corral_host_sandboxes", "provider"))
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"corral_host_exec_duration_seconds", map[string]string{"outcome": "ok"}, 2},
		{"corral_host_checkpoint_duration_seconds", map[string]string{"op": "pause", "outcome": "ok"}, 1},
		{"corral_host_checkpoint_duration_seconds", map[string]string{"op": "resume", "outcome": "ok"}, 1},
	} {
		if v, _ := m.Value(c.name, c.labels); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if _, ok := m.Value("process_open_fds", nil); !ok {
		t.Error("no process_open_fds: the process collector is missing")
	}
	pressure := func(m metricstest.Scrape, cond string) float64 {
		v, ok := m.Value("corral_host_pressure", map[string]string{"condition": cond})
		if !ok {
			t.Errorf("no corral_host_pressure{condition=%s}", cond)
		}
		return v
	}
	if pressure(m, "memory_pressure") != 0 || pressure(m, "disk_pressure") != 0 {
		t.Errorf("without pressure: corral_host_pressure = %v, %v, want 0, 0", pressure(m, "memory_pressure"), pressure(m, "disk_pressure"))
	}
	// Under memory pressure the next heartbeat pauses the idle sandbox
	// and still reports the pressure, which nothing else can relieve.
	e.pressure.Store(true)
	e.heartbeat(r)
	m = metricstest.Get(t, url)
	if pressure(m, "memory_pressure") != 1 || pressure(m, "disk_pressure") != 0 {
		t.Errorf("under memory pressure: corral_host_pressure = %v, %v, want 1, 0", pressure(m, "memory_pressure"), pressure(m, "disk_pressure"))
	}
	if v, _ := m.Value("corral_host_checkpoint_duration_seconds", map[string]string{"op": "pause", "outcome": "ok"}); v != 2 {
		t.Errorf("pauses after the pressure = %v, want 2", v)
	}
}

// A metrics address beyond loopback needs --metrics-insecure-listen.
func TestAgentMetricsBeyondLoopbackNeedsInsecure(t *testing.T) {
	e := setup(t)
	cfg := e.config()
	cfg.MetricsAddr = "0.0.0.0:0"
	_, err := agent.New(context.Background(), cfg)
	if errdefs.KindOf(err) != errdefs.InvalidArgumentKind || !strings.Contains(err.Error(), "--metrics-insecure-listen") {
		t.Fatalf("New with a metrics address beyond loopback: %v, want an invalid argument naming --metrics-insecure-listen", err)
	}
	// Validated only: the test listens on loopback alone.
	cfg.MetricsInsecureListen = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("with MetricsInsecureListen: %v", err)
	}
}

// On a gVisor host the pool's gauges follow its warm sandboxes, and a
// claimed one shows as a ready sandbox of the gvisor provider.
func TestAgentMetricsWarmPoolGVisor(t *testing.T) {
	e, d, _ := gvisorPoolEnv(t)
	e.metricsAddr = "127.0.0.1:0"
	r := e.start()
	defer r.stop()
	e.waitPoolHeartbeat(2)
	m := metricstest.Get(t, r.a.MetricsURL())
	for _, name := range []string{"corral_host_warm_pool_ready", "corral_host_warm_pool_target"} {
		if v, _ := m.Value(name, map[string]string{"image": poolImage}); v != 2 {
			t.Errorf("%s = %v, want 2", name, v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "sess-m", Image: poolImage, Limits: poolLimitsPB()}); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	if out, _, err := execStream(t, c, "sess-m", "echo", "in gvisor"); err != nil || out != "in gvisor\n" {
		t.Fatalf("exec: %q %v", out, err)
	}
	m = metricstest.Get(t, r.a.MetricsURL())
	if v, _ := m.Value("corral_host_sandboxes", map[string]string{"state": "ready", "provider": d.Name()}); v != 1 {
		t.Errorf("corral_host_sandboxes{ready,%s} = %v, want 1 (providers %v)", d.Name(), v, m.LabelValues("corral_host_sandboxes", "provider"))
	}
	if v, _ := m.Value("corral_host_exec_duration_seconds", map[string]string{"outcome": "ok"}); v != 1 {
		t.Errorf("exec count = %v, want 1", v)
	}
	if v, _ := m.Value("corral_host_warm_pool_ready", map[string]string{"image": poolImage}); v > 1 {
		t.Errorf("after a claim the pool still shows %v ready (it refills later, never at once past 1)", v)
	}
}
