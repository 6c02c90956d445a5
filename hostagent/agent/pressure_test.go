package agent_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// noPause is a driver that cannot pause, as a host without
// --pausable-sandboxes.
type noPause struct{ driver.Driver }

func (noPause) Pause(context.Context, driver.Ref) error {
	return errdefs.Unimplemented("this driver does not pause")
}

// idle is one idle sandbox of a pressure test, ensured in this order, a
// minute apart: the first has been idle longest.
type idle struct{ key, tenant string }

// twoTenants are three idle sandboxes of two tenants: b-1 has been idle
// longest, but tenant-a has two. The documented order is a-1 (the tenant
// with the most, its idlest), then b-1 (one each now: b-1 idle longer),
// then a-2.
var twoTenants = []idle{{"b-1", "tenant-b"}, {"a-1", "tenant-a"}, {"a-2", "tenant-a"}}

// ensureIdle ensures the sandboxes one minute apart on the env's clock.
func (e *env) ensureIdle(image string, limits *pb.Limits, sbs []idle) {
	e.t.Helper()
	for _, s := range sbs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: s.key, Image: image, Limits: limits, Tenant: s.tenant})
		cancel()
		if err != nil {
			e.t.Fatalf("ensuring %s: %v", s.key, err)
		}
		e.clock.Advance(time.Minute)
	}
}

// runningCount counts the driver's sandboxes that are not paused.
func runningCount(ctx context.Context, d driver.Driver) (int, error) {
	rs, err := d.List(ctx)
	n := 0
	for _, r := range rs {
		if !r.Paused {
			n++
		}
	}
	return n, err
}

func pauseKeys(hb *pb.Heartbeat) []string {
	var keys []string
	for _, p := range hb.PressurePauses {
		if p.Reason != "memory_pressure" {
			return append(keys, "bad reason "+p.Reason)
		}
		keys = append(keys, p.Key)
	}
	return keys
}

func evictionKeys(hb *pb.Heartbeat) []string {
	var keys []string
	for _, ev := range hb.Evictions {
		keys = append(keys, ev.Key)
	}
	return keys
}

// sandboxStates maps each reported sandbox to "ready", "paused" or
// "evicted".
func sandboxStates(hb *pb.Heartbeat) map[string]string {
	m := map[string]string{}
	for _, s := range hb.Sandboxes {
		switch {
		case s.State == pb.SandboxState_SANDBOX_STATE_EVICTED:
			m[s.Key] = "evicted"
		case s.Paused:
			m[s.Key] = "paused"
		default:
			m[s.Key] = "ready"
		}
	}
	return m
}

// TestMemoryPressurePausesIdleSandboxesGVisor: under memory pressure a
// host that can pause pauses its idle gVisor sandboxes (runsc checkpoint)
// in the documented order, until the pressure is gone, and evicts none
// while one is left to pause; a paused one resumes on its next command.
func TestMemoryPressurePausesIdleSandboxesGVisor(t *testing.T) {
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir(), Pausable: true})
	e := setup(t)
	e.wrap = func(driver.Driver) driver.Driver { return d }
	// Pressure lasts while more sandboxes run (unpaused) than allowed.
	var allowed atomic.Int64
	e.pressureFn = func(ctx context.Context) (agent.Pressure, error) {
		n, err := runningCount(ctx, d)
		return agent.Pressure{Memory: e.pressure.Load() && int64(n) > allowed.Load()}, err
	}
	r := e.start()
	defer r.stop()
	e.ensureIdle(poolImage, poolLimitsPB(), twoTenants)
	c := e.sandboxClient()
	if _, err := c.WriteFile(context.Background(), &pb.WriteFileRequest{Key: "b-1", Path: "kept.txt", Data: []byte("kept across the pause")}); err != nil {
		t.Fatal(err)
	}
	// The write was a use: using the others after it keeps b-1 the
	// sandbox idle longest.
	e.clock.Advance(time.Minute)
	for _, k := range []string{"a-1", "a-2"} {
		if _, _, err := execStream(t, c, k, "true"); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Minute)
	}

	// Room for one running sandbox: two are paused, a-1 then b-1.
	allowed.Store(1)
	e.pressure.Store(true)
	start := time.Now()
	hb := e.heartbeat(r)
	t.Logf("two pauses under pressure in %v", time.Since(start))
	if got := pauseKeys(hb); !slices.Equal(got, []string{"a-1", "b-1"}) {
		t.Fatalf("paused under pressure %v, want [a-1 b-1]", got)
	}
	if len(hb.Evictions) != 0 {
		t.Fatalf("evicted %v while sandboxes could be paused", evictionKeys(hb))
	}
	if got := sandboxStates(hb); got["a-1"] != "paused" || got["b-1"] != "paused" || got["a-2"] != "ready" {
		t.Fatalf("sandboxes after the pauses: %v", got)
	}
	if hb.Allocated.GetMemoryBytes() != poolClass.Limits.MemoryBytes {
		t.Errorf("allocated with one sandbox running: %v", hb.Allocated)
	}
	for _, cond := range hb.Conditions {
		if !cond.Ok {
			t.Errorf("condition %s not ok after the pauses relieved the pressure: %s", cond.Type, cond.Message)
		}
	}

	// No room at all: the last one is paused, and with none left to pause
	// nothing is evicted (a paused sandbox holds no memory to free).
	allowed.Store(0)
	hb = e.heartbeat(r)
	if got := pauseKeys(hb); !slices.Equal(got, []string{"a-2"}) || len(hb.Evictions) != 0 {
		t.Fatalf("second heartbeat: paused %v, evicted %v; want [a-2] and none", got, evictionKeys(hb))
	}
	allowed.Store(-1) // pressure whatever runs
	hb = e.heartbeat(r)
	if len(hb.PressurePauses) != 0 || len(hb.Evictions) != 0 {
		t.Fatalf("with every sandbox paused: paused %v, evicted %v", pauseKeys(hb), evictionKeys(hb))
	}
	for _, cond := range hb.Conditions {
		if cond.Type == "memory_pressure" && (cond.Ok || !strings.Contains(cond.Message, "no idle sandbox left")) {
			t.Errorf("memory_pressure with nothing left to pause: %v", cond)
		}
	}
	if n, err := runningCount(context.Background(), d); err != nil || n != 0 {
		t.Fatalf("containerd runs %d sandboxes (%v), want every one paused", n, err)
	}

	// The next command resumes the sandbox, its files as they were.
	e.pressure.Store(false)
	out, res, err := execStream(t, c, "b-1", "cat", "kept.txt")
	if err != nil || res.ExitCode != 0 || out != "kept across the pause" {
		t.Fatalf("exec after the pause: %q %v %v", out, res, err)
	}
	if got := sandboxStates(e.heartbeat(r)); got["b-1"] != "ready" || got["a-1"] != "paused" {
		t.Fatalf("after b-1's command: %v", got)
	}
}

// TestMemoryPressureEvictsInOrderWithoutPauseGVisor: a host whose driver
// cannot pause evicts its idle gVisor sandboxes under memory pressure, in
// the same order, until the pressure is gone.
func TestMemoryPressureEvictsInOrderWithoutPauseGVisor(t *testing.T) {
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir()})
	e := setup(t)
	e.wrap = func(driver.Driver) driver.Driver { return d }
	e.pressureFn = func(ctx context.Context) (agent.Pressure, error) {
		rs, err := d.List(ctx)
		return agent.Pressure{Memory: e.pressure.Load() && len(rs) > 1}, err
	}
	r := e.start()
	defer r.stop()
	e.ensureIdle(poolImage, poolLimitsPB(), twoTenants)
	e.pressure.Store(true)
	hb := e.heartbeat(r)
	if got := evictionKeys(hb); !slices.Equal(got, []string{"a-1", "b-1"}) || len(hb.PressurePauses) != 0 {
		t.Fatalf("evicted %v (paused %v), want [a-1 b-1] evicted", got, pauseKeys(hb))
	}
	if got := sandboxStates(hb); got["a-1"] != "evicted" || got["b-1"] != "evicted" || got["a-2"] != "ready" {
		t.Fatalf("sandboxes after the evictions: %v", got)
	}
}

// TestPressureReliefOrder: the documented order over six idle sandboxes of
// three tenants, pausing (a driver that pauses) and evicting (one that
// cannot) alike: the tenant with the most running idle sandboxes first,
// the sandbox idle longest between tenants with as many, and within a
// tenant the one idle longest. A sandbox running a command is left alone.
func TestPressureReliefOrder(t *testing.T) {
	sbs := []idle{{"c-1", "t-c"}, {"b-1", "t-b"}, {"a-1", "t-a"}, {"b-2", "t-b"}, {"a-2", "t-a"}, {"a-3", "t-a"}, {"busy", "t-a"}}
	want := []string{"a-1", "b-1", "a-2", "c-1", "b-2", "a-3"}
	for _, tc := range []struct {
		name     string
		pausable bool
	}{{"pause", true}, {"evict", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			if !tc.pausable {
				e.wrap = func(d driver.Driver) driver.Driver { return noPause{d} }
			}
			e.pressureFn = func(context.Context) (agent.Pressure, error) {
				return agent.Pressure{Memory: e.pressure.Load()}, nil
			}
			started := make(chan struct{})
			e.fake.Handle("block", func(ctx context.Context, p *drivertest.Proc) int {
				close(started)
				<-ctx.Done()
				return 137
			})
			r := e.start()
			defer r.stop()
			e.ensureIdle("img", &pb.Limits{CpuMillis: 100, MemoryBytes: 64 << 20}, sbs)
			// "busy" runs a command through the pressure: never paused or
			// evicted, whatever its tenant.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := e.sandboxClient()
			go func() { _, _ = c.Exec(ctx, &pb.ExecRequest{Key: "busy", Command: []string{"block"}}) }()
			<-started
			e.pressure.Store(true)
			hb := e.heartbeat(r)
			got := pauseKeys(hb)
			if !tc.pausable {
				got = evictionKeys(hb)
				if len(hb.PressurePauses) != 0 {
					t.Errorf("a driver that cannot pause paused %v", pauseKeys(hb))
				}
			} else if len(hb.Evictions) != 0 {
				t.Errorf("evicted %v while pausing", evictionKeys(hb))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("relieved in the order %v, want %v", got, want)
			}
		})
	}
}

// slowPause holds every Pause until release is closed, once it has said
// so on pausing.
type slowPause struct {
	driver.Driver
	pausing, release chan struct{}
}

func (d slowPause) Pause(ctx context.Context, ref driver.Ref) error {
	close(d.pausing)
	<-d.release
	return d.Driver.Pause(ctx, ref)
}

// TestCommandDuringPressurePauseWaitsAndResumes: a command that reaches a
// sandbox while the agent pauses it under pressure is neither refused nor
// lost: it waits for the pause, resumes the sandbox and runs.
func TestCommandDuringPressurePauseWaitsAndResumes(t *testing.T) {
	e := setup(t)
	sp := slowPause{pausing: make(chan struct{}), release: make(chan struct{})}
	e.wrap = func(d driver.Driver) driver.Driver { sp.Driver = d; return sp }
	e.pressureFn = func(ctx context.Context) (agent.Pressure, error) {
		n, err := runningCount(ctx, e.fake)
		return agent.Pressure{Memory: e.pressure.Load() && n > 0}, err
	}
	waiting := make(chan struct{})
	e.logger = slog.New(onMessage{"a command waits for its sandbox's pause to end, to resume it", sync.OnceFunc(func() { close(waiting) })})
	r := e.start()
	defer r.stop()
	e.ensureIdle("img", nil, []idle{{"s1", "t"}})
	e.pressure.Store(true)
	beat := make(chan *pb.Heartbeat, 1)
	go func() { beat <- e.heartbeat(r) }()
	<-sp.pausing
	c := e.sandboxClient()
	type outcome struct {
		out string
		res *pb.ExecResult
		err error
	}
	ran := make(chan outcome, 1)
	go func() {
		out, res, err := execStream(t, c, "s1", "echo", "after the pause")
		ran <- outcome{out, res, err}
	}()
	select { // the agent says the command waits
	case <-waiting:
	case <-time.After(20 * time.Second):
		t.Fatal("the command did not wait for the pause in progress")
	}
	close(sp.release)
	if hb := <-beat; !slices.Equal(pauseKeys(hb), []string{"s1"}) {
		t.Fatalf("paused under pressure %v, want [s1]", pauseKeys(hb))
	}
	e.pressure.Store(false)
	got := <-ran
	if got.err != nil || got.res.ExitCode != 0 || got.out != "after the pause\n" {
		t.Fatalf("command during the pause: %q %v %v", got.out, got.res, got.err)
	}
	if n, err := runningCount(context.Background(), e.fake); err != nil || n != 1 {
		t.Fatalf("after the command %d sandboxes run (%v), want it resumed", n, err)
	}
}

// onMessage is a slog.Handler that calls fn at each record with message
// msg, and drops every record.
type onMessage struct {
	msg string
	fn  func()
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.fn()
	}
	return nil
}
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }
