package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/logging"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

const hostID = "host-1"

// env is a test controller on loopback, a fake driver and a state dir that
// outlive each agent started over them.
type env struct {
	t        *testing.T
	ctl      *hostctl.Controller
	addr     string
	token    logging.Secret
	fake     *drivertest.Fake
	stateDir string

	// Knobs for the next agent.
	allocatable agent.Resources
	pressure    atomic.Bool
	checkFails  atomic.Bool
	pressureFn  agent.PressureFunc
	clock       *clock
	srv         interface{ Stop() }
	reconnect   chan time.Time // the agents' reconnect timer
	reapTick    chan time.Time // the agents' reaper ticker (nil: never)
	logger      *slog.Logger   // the agents' (nil: discarded)
	// wrap, if set, wraps the next agent's driver.
	wrap func(driver.Driver) driver.Driver
	// pools are the next agent's warm pool classes, and poolRefillHold
	// its Config.PoolRefillHold.
	pools          []agent.PoolClass
	poolRefillHold time.Duration
	// providers are the next agent's (nil: the default), and canaryTick
	// its canary loop's ticker (nil: never).
	providers  []agent.Provider
	canaryTick chan time.Time
	// metricsAddr is the next agent's Config.MetricsAddr.
	metricsAddr string
	// egress is the next agent's Config.Egress.
	egress agent.EgressConfig
	// more are the next agent's runtimes besides "fake" (the default),
	// each with its driver (a fake's state outlives each agent).
	more []agent.RuntimeDriver
	// wrapMore, if set, wraps the drivers of more.
	wrapMore func(driver.Driver) driver.Driver
}

// clock is a manual clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func setup(t *testing.T) *env {
	t.Helper()
	ctl, err := hostctl.New(hostctl.Config{Dir: t.TempDir(), HeartbeatInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := ctl.Serve(l)
	t.Cleanup(func() { srv.Stop() })
	tok, err := ctl.IssueToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	fake := drivertest.NewFake(t.TempDir())
	fake.SetClock(clk.Now)
	return &env{
		t: t, ctl: ctl, addr: l.Addr().String(), token: logging.Secret(tok.Reveal()),
		fake: fake, stateDir: t.TempDir(), clock: clk,
		srv: srv, reconnect: make(chan time.Time),
	}
}

// running is one agent process, as far as the test is concerned.
type running struct {
	a    *agent.Agent
	tick chan time.Time
	stop func() // ends Run and waits for it
}

func (e *env) config() agent.Config {
	return agent.Config{
		HostID: hostID, ControlPlane: e.addr, JoinToken: e.token, StateDir: e.stateDir,
		ListenAddr: "127.0.0.1:0", Driver: e.fake.Reopen(), Runtime: "fake",
		Capacity: agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30}, Allocatable: e.allocatable,
		DefaultLimits: driver.Limits{CPUMillis: 1000, MemoryBytes: 512 << 20},
		Pressure: func(ctx context.Context) (agent.Pressure, error) {
			if e.pressureFn != nil {
				return e.pressureFn(ctx)
			}
			return agent.Pressure{Memory: e.pressure.Load()}, nil
		},
		Checks: []agent.Check{{Type: "probe", Run: func(ctx context.Context) error {
			if e.checkFails.Load() {
				return errors.New("probe failed: no canary today")
			}
			return nil
		}}},
		Images: func(context.Context) ([]string, error) { return []string{"img"}, nil },
		Usage: func(context.Context) (agent.Resources, error) {
			return agent.Resources{MemoryBytes: 1 << 30, DiskBytes: 2 << 30}, nil
		},
		Labels: map[string]string{"zone": "a"},
		Now:    e.clock.Now,
		After:  func(time.Duration) <-chan time.Time { return e.reconnect },
		NewReapTicker: func(time.Duration) (<-chan time.Time, func()) {
			return e.reapTick, func() {}
		},
		Logger:         e.logger,
		Pools:          e.pools,
		PoolRefillHold: e.poolRefillHold,
		MetricsAddr:    e.metricsAddr,
		Egress:         e.egress,
		Providers:      e.providers,
		NewCanaryTicker: func(time.Duration) (<-chan time.Time, func()) {
			return e.canaryTick, func() {}
		},
	}
}

// start runs a new Agent over the env's state dir (as after a restart) and
// waits until it registered and sent its first heartbeat.
func (e *env) start() *running {
	e.t.Helper()
	before := e.ctl.Hosts()[hostID]
	tick := make(chan time.Time)
	cfg := e.config()
	if e.wrap != nil {
		cfg.Driver = e.wrap(cfg.Driver)
	}
	if len(e.more) > 0 {
		cfg.Runtimes = []agent.RuntimeDriver{{Name: cfg.Runtime, Driver: cfg.Driver}}
		for _, m := range e.more {
			if e.wrapMore != nil {
				m.Driver = e.wrapMore(m.Driver)
			}
			cfg.Runtimes = append(cfg.Runtimes, m)
		}
	}
	cfg.NewTicker = func(time.Duration) (<-chan time.Time, func()) { return tick, func() {} }
	ctx, cancel := context.WithCancel(context.Background())
	a, err := agent.New(ctx, cfg)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	r := &running{a: a, tick: tick, stop: func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	}}
	e.t.Cleanup(func() {
		cancel()
	})
	e.wait("registration and first heartbeat", func(h hostctl.Host) bool {
		return h.Connected && h.Registers == before.Registers+1 && h.Heartbeats > before.Heartbeats
	})
	return r
}

// heartbeat makes the agent send one heartbeat and returns it.
func (e *env) heartbeat(r *running) *pb.Heartbeat {
	e.t.Helper()
	n := e.ctl.Hosts()[hostID].Heartbeats
	r.tick <- e.clock.Now()
	e.wait("heartbeat", func(h hostctl.Host) bool { return h.Heartbeats > n })
	return e.ctl.Hosts()[hostID].Last
}

func (e *env) wait(what string, cond func(hostctl.Host) bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.ctl.Wait(ctx, func(hs map[string]hostctl.Host) bool { return cond(hs[hostID]) }); err != nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func (e *env) ensure(key string, limits *pb.Limits) (*pb.SandboxStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: key, Image: "img", Runtime: "fake", Limits: limits})
}

func (e *env) sandboxClient() pb.SandboxServiceClient {
	e.t.Helper()
	c, closeFn, err := e.ctl.DialSandbox(hostID, "")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { closeFn() })
	return c
}

// execStream runs a command and returns the streamed stdout and the result.
func execStream(t *testing.T, c pb.SandboxServiceClient, key string, argv ...string) (string, *pb.ExecResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Exec(ctx, &pb.ExecRequest{Key: key, Command: argv})
	if err != nil {
		return "", nil, errgrpc.FromStatus(err)
	}
	var out strings.Builder
	var res *pb.ExecResult
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", nil, errgrpc.FromStatus(err)
		}
		if ch := m.GetOutput(); ch != nil && len(ch.Data) > 1<<20 {
			t.Fatalf("an output chunk of %d bytes: clients with gRPC's default 4 MiB limit may not take it", len(ch.Data))
		}
		if ch := m.GetOutput(); ch != nil && ch.Stream == pb.OutputStream_OUTPUT_STREAM_STDOUT {
			if res != nil {
				t.Fatal("output after the result")
			}
			out.Write(ch.Data)
		}
		if r := m.GetResult(); r != nil {
			res = r
		}
	}
	if res == nil {
		t.Fatal("exec ended without a result")
	}
	return out.String(), res, nil
}

func refs(t *testing.T, d driver.Driver) []driver.Ref {
	t.Helper()
	rs, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestLifecycleAcrossRestart(t *testing.T) {
	e := setup(t)
	r := e.start()
	reg := e.ctl.Hosts()[hostID].Register
	if reg.Runtimes[0] != "fake" || reg.Capacity.GetMemoryBytes() != 8<<30 || len(reg.Sandboxes) != 0 ||
		len(reg.Images) != 1 || reg.Labels["zone"] != "a" || reg.SandboxAddress == "" {
		t.Fatalf("register = %v", reg)
	}
	if st, err := os.Stat(filepath.Join(e.stateDir, "pki", "host-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("host key: %v, %v", st, err)
	}

	st, err := e.ensure("s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != pb.SandboxState_SANDBOX_STATE_READY || st.Provider != "fake" {
		t.Fatalf("ensure status = %v", st)
	}
	// Ensure is idempotent.
	if _, err := e.ensure("s1", nil); err != nil {
		t.Fatal(err)
	}
	created := refs(t, e.fake)
	if len(created) != 1 || created[0].Key != "s1" {
		t.Fatalf("driver holds %v", created)
	}

	c := e.sandboxClient()
	out, res, err := execStream(t, c, "s1", "echo", "hello", "corral")
	if err != nil || out != "hello corral\n" || res.ExitCode != 0 || string(res.Stdout) != "hello corral\n" {
		t.Fatalf("exec: %q %v %v", out, res, err)
	}
	ctx := context.Background()
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "notes/a.txt", Data: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 8<<20) // beyond gRPC's default 4 MiB message
	for i := range big {
		big[i] = byte(i % 251)
	}
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "s1", Path: "big.bin", Data: big}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "big.bin"}); err != nil || string(got.Data) != string(big) {
		t.Fatalf("reading back 8 MiB: %v", err)
	}
	if l, err := c.ListFiles(ctx, &pb.ListFilesRequest{Key: "s1"}); err != nil || len(l.Files) != 2 {
		t.Fatalf("ListFiles: %v %v", l, err)
	}
	hb := e.heartbeat(r)
	if len(hb.Sandboxes) != 1 || hb.Allocated.GetMemoryBytes() != 512<<20 || len(hb.Conditions) != 3 || hb.Used.GetDiskBytes() != 2<<30 {
		t.Fatalf("heartbeat = %v", hb)
	}

	// Restart: a new Agent over the same state dir and driver state.
	r.stop()
	e.wait("disconnect", func(h hostctl.Host) bool { return !h.Connected })
	r = e.start()
	reg = e.ctl.Hosts()[hostID].Register
	if len(reg.Sandboxes) != 1 || reg.Sandboxes[0].Key != "s1" || reg.Sandboxes[0].State != pb.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("after restart, register = %v", reg.Sandboxes)
	}
	if now := refs(t, e.fake); len(now) != 1 || now[0].ID != created[0].ID {
		t.Fatalf("after restart the driver holds %v, want the same %v (re-attached, not recreated)", now, created)
	}
	c = e.sandboxClient()
	got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "s1", Path: "notes/a.txt"})
	if err != nil || string(got.Data) != "kept" {
		t.Fatalf("workspace file after restart: %v %v", got, err)
	}
	if out, _, err := execStream(t, c, "s1", "echo", "again"); err != nil || out != "again\n" {
		t.Fatalf("exec after restart: %q %v", out, err)
	}

	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := e.ctl.Destroy(ctx, hostID, "s1"); err != nil {
		t.Fatal(err)
	}
	if now := refs(t, e.fake); len(now) != 0 {
		t.Fatalf("after destroy the driver holds %v", now)
	}
	if recs, _ := os.ReadDir(filepath.Join(e.stateDir, "sandboxes")); len(recs) != 0 {
		t.Fatalf("records left after destroy: %v", recs)
	}
	if _, _, err := execStream(t, c, "s1", "true"); !errdefs.IsNotFound(err) {
		t.Fatalf("exec after destroy: %v, want not found", err)
	}
	if err := e.ctl.Destroy(ctx, hostID, "s1"); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	r.stop()
}

func TestRestartRemovesLeftovers(t *testing.T) {
	e := setup(t)
	r := e.start()
	for _, k := range []string{"keep", "moved"} {
		if _, err := e.ensure(k, nil); err != nil {
			t.Fatal(err)
		}
	}
	r.stop()
	// While the host was down: the control plane moved "moved" elsewhere,
	// and a crash left a sandbox the agent never recorded.
	e.ctl.Unplace(hostID, "moved")
	if _, err := e.fake.Create(context.Background(), driver.Spec{Key: "orphan"}); err != nil {
		t.Fatal(err)
	}
	r = e.start()
	defer r.stop()
	var keys []string
	for _, ref := range refs(t, e.fake) {
		keys = append(keys, ref.Key)
	}
	if strings.Join(keys, ",") != "keep" {
		t.Fatalf("after restart the driver holds %v, want only keep", keys)
	}
	if hb := e.heartbeat(r); len(hb.Sandboxes) != 1 || hb.Sandboxes[0].Key != "keep" {
		t.Fatalf("heartbeat sandboxes = %v", hb.Sandboxes)
	}
}

func TestEnsureRefusals(t *testing.T) {
	e := setup(t)
	e.allocatable = agent.Resources{CPUMillis: 4000, MemoryBytes: 1 << 30}
	r := e.start()
	defer r.stop()
	if _, err := e.ensure("big", &pb.Limits{MemoryBytes: 768 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err := e.ensure("more", &pb.Limits{MemoryBytes: 512 << 20})
	if errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("ensure beyond capacity: %v, want resource exhausted about memory", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "x", Image: "img", Runtime: "gvisor"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"gvisor"`) {
		t.Fatalf("ensure for another runtime: %v", err)
	}
	if n := len(refs(t, e.fake)); n != 1 {
		t.Fatalf("refused ensures left %d sandboxes, want 1", n)
	}
}

func TestConfigValidate(t *testing.T) {
	e := setup(t)
	good := e.config()
	cases := map[string]func(*agent.Config){
		"bad host id":        func(c *agent.Config) { c.HostID = "Host_1" },
		"no control plane":   func(c *agent.Config) { c.ControlPlane = "" },
		"relative state dir": func(c *agent.Config) { c.StateDir = "state" },
		"no driver":          func(c *agent.Config) { c.Driver = nil },
		"no runtime":         func(c *agent.Config) { c.Runtime = "" },
		"wildcard listen address, nothing to advertise": func(c *agent.Config) { c.ListenAddr = "0.0.0.0:8443" },
		"any-host listen address, nothing to advertise": func(c *agent.Config) { c.ListenAddr = ":8443" },
		"bad listen address":                            func(c *agent.Config) { c.ListenAddr = "8443" },
	}
	for name, mut := range cases {
		c := good
		mut(&c)
		if err := c.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	wild := good
	wild.ListenAddr, wild.AdvertiseAddr = "0.0.0.0:8443", "10.0.0.7:8443"
	if err := wild.Validate(); err != nil {
		t.Fatalf("wildcard listen address with an advertised one: %v", err)
	}
	// Without a certificate and without a token, New says what is missing.
	good.JoinToken = ""
	if _, err := agent.New(context.Background(), good); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "join token") {
		t.Fatalf("New without token: %v", err)
	}
}

func TestJoinTokenIsSingleUse(t *testing.T) {
	e := setup(t)
	r := e.start()
	r.stop()
	cfg := e.config()
	cfg.HostID = "host-2"
	cfg.StateDir = t.TempDir()
	_, err := agent.New(context.Background(), cfg)
	if errdefs.KindOf(err) != errdefs.UnauthenticatedKind || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("second join with the same token: %v", err)
	}
	// A fresh token does not hand out a joined host's identity.
	tok, err := e.ctl.IssueToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostID, cfg.JoinToken = hostID, logging.Secret(tok.Reveal())
	if _, err := agent.New(context.Background(), cfg); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("joining as an already joined host: %v", err)
	}
}

func TestSandboxServiceAdmitsOnlyTheControlPlane(t *testing.T) {
	e := setup(t)
	r := e.start()
	defer r.stop()
	addr := e.ctl.Hosts()[hostID].Register.SandboxAddress
	ca := e.ctl.CA()
	key, csr, err := hostpki.NewKeyAndCSR("host-2")
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignHost(csr, "host-2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherHost := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	other, err := hostpki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	strangerCP, err := other.IssueControlPlane(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ownCP, err := ca.IssueControlPlane(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cert tls.Certificate
		want errdefs.Kind
	}{
		{"control plane", ownCP, errdefs.NotFoundKind}, // reaches the handler
		{"another host of the same CA", otherHost, errdefs.UnavailableKind},
		{"a control plane of another CA", strangerCP, errdefs.UnavailableKind},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client, closeFn, err := hostctl.DialSandbox(ca, c.cert, hostID, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer closeFn()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = client.ReadFile(ctx, &pb.ReadFileRequest{Key: "none", Path: "x"})
			if got := errdefs.KindOf(errgrpc.FromStatus(err)); got != c.want {
				t.Fatalf("ReadFile: %v (kind %v), want kind %v", err, got, c.want)
			}
		})
	}
}
