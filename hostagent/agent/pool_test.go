package agent_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/hostctl"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

const poolImage = "localhost/corral/busybox:1"

// poolClass is the class the pool tests keep: every limit set, the disk
// one too, so that each pooled sandbox has its own workspace image.
var poolClass = agent.PoolClass{Image: poolImage, Min: 2, Max: 2,
	Limits: driver.Limits{CPUMillis: 1000, MemoryBytes: 512 << 20, Pids: 128, DiskBytes: 64 << 20}}

func poolLimitsPB() *pb.Limits {
	l := poolClass.Limits
	return &pb.Limits{CpuMillis: l.CPUMillis, MemoryBytes: l.MemoryBytes, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

// gvisorPoolEnv is an env whose agents run the containerd gVisor driver
// (in a fresh state dir, swept at the end) with the pool class above.
func gvisorPoolEnv(t *testing.T) (*env, *containerd.Driver, string) {
	t.Helper()
	dir := t.TempDir()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: dir})
	e := setup(t)
	e.wrap = func(driver.Driver) driver.Driver { return d }
	e.pools = []agent.PoolClass{poolClass}
	return e, d, dir
}

// waitPoolHeartbeat waits for a heartbeat that reports the pool's class
// with ready sandboxes (the agent sends one whenever the counts change).
func (e *env) waitPoolHeartbeat(ready int32) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := e.ctl.Wait(ctx, func(hs map[string]hostctl.Host) bool {
		wp := hs[hostID].Last.GetWarmPools()
		return hs[hostID].Connected && len(wp) == 1 && wp[0].Ready == ready && wp[0].Image == poolImage &&
			wp[0].Limits.GetDiskBytes() == poolClass.Limits.DiskBytes
	})
	if err != nil {
		e.t.Fatalf("waiting for a heartbeat with %d warm sandboxes: %v (last: %v)", ready, err, e.ctl.Hosts()[hostID].Last.GetWarmPools())
	}
}

// pooled returns the ids of the driver's sandboxes that carry the pool
// label, counted in containerd itself.
func pooled(t *testing.T, d driver.Driver) []string {
	t.Helper()
	var ids []string
	for _, r := range refs(t, d) {
		if r.Labels[driver.PoolLabel] != "" {
			ids = append(ids, r.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func refFor(t *testing.T, d driver.Driver, key string) driver.Ref {
	t.Helper()
	for _, r := range refs(t, d) {
		if r.Key == key {
			return r
		}
	}
	t.Fatalf("the driver has no sandbox for %s", key)
	return driver.Ref{}
}

// TestWarmPoolClaimLeavesNoTraceGVisor: two sessions of two tenants claim
// the two sandboxes of one pool; each binds its own environment and labels,
// and neither sees anything of the other (files in /workspace and /tmp,
// environment, processes, labels) nor of the pool. The pool refills in the
// background (seen in the heartbeats), a released sandbox is destroyed and
// never pooled again, and an ensure of another class is created cold.
func TestWarmPoolClaimLeavesNoTraceGVisor(t *testing.T) {
	e, d, _ := gvisorPoolEnv(t)
	r := e.start()
	defer r.stop()
	e.waitPoolHeartbeat(2)
	before := r.a.Pool()[0].IDs
	slices.Sort(before)
	if got := pooled(t, d); !slices.Equal(got, before) {
		t.Fatalf("containerd holds pooled sandboxes %v, the agent %v", got, before)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tenants := []struct{ key, tenant, secret string }{
		{"sess-a", "tenant-a", "secret-of-a"},
		{"sess-b", "tenant-b", "secret-of-b"},
	}
	var claimed []string
	for _, tn := range tenants {
		if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: tn.key, Image: poolImage, Limits: poolLimitsPB(),
			Env: map[string]string{"TENANT_SECRET": tn.secret}, Labels: map[string]string{"tenant": tn.tenant}}); err != nil {
			t.Fatal(err)
		}
		ref := refFor(t, d, tn.key)
		if !slices.Contains(before, ref.ID) {
			t.Fatalf("%s got sandbox %s, not one of the pool's %v", tn.key, ref.ID, before)
		}
		if len(ref.Labels) != 1 || ref.Labels["tenant"] != tn.tenant {
			t.Fatalf("%s's sandbox has labels %v, want only tenant=%s", tn.key, ref.Labels, tn.tenant)
		}
		claimed = append(claimed, ref.ID)
	}
	c := e.sandboxClient()
	run := func(key, script string) string {
		t.Helper()
		out, res, err := execStream(t, c, key, "sh", "-c", script)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %q: %v %v", key, script, res, err)
		}
		return out
	}
	// What a sandbox shows of itself: environment, files, processes, name.
	inspect := `env; echo ---; ls -A /workspace /tmp /mnt/session/outputs; echo ---; cat /proc/[0-9]*/cmdline | tr '\0' ' '; echo; hostname`
	for i, tn := range tenants {
		other := tenants[1-i]
		run(tn.key, `echo "$TENANT_SECRET" > /workspace/trace-`+tn.tenant+`; echo x > /tmp/trace-`+tn.tenant+`;`+
			` sh -c 'while :; do sleep 1; done' proc-`+tn.tenant+` </dev/null >/dev/null 2>&1 &`)
		own := run(tn.key, inspect)
		// The inspection sees what it looks for: its own traces.
		for _, want := range []string{"TENANT_SECRET=" + tn.secret, "trace-" + tn.tenant, "proc-" + tn.tenant} {
			if !strings.Contains(own, want) {
				t.Fatalf("%s does not see its own %q:\n%s", tn.key, want, own)
			}
		}
		seen := run(other.key, inspect)
		for _, trace := range []string{tn.secret, "trace-" + tn.tenant, "proc-" + tn.tenant, tn.tenant, "pool-", driver.PoolLabel} {
			if strings.Contains(seen, trace) {
				t.Errorf("%s sees %q of %s:\n%s", other.key, trace, tn.key, seen)
			}
		}
	}

	// Refilled in the background: two new sandboxes, reported in a heartbeat.
	e.waitPoolHeartbeat(2)
	after := r.a.Pool()[0].IDs
	for _, id := range after {
		if slices.Contains(before, id) {
			t.Fatalf("the refilled pool %v holds a claimed sandbox (pool before: %v)", after, before)
		}
	}

	// Another class (other limits) is created cold and leaves the pool be.
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "sess-cold", Image: poolImage,
		Limits: &pb.Limits{CpuMillis: 500, MemoryBytes: 256 << 20, Pids: 64}}); err != nil {
		t.Fatal(err)
	}
	if id := refFor(t, d, "sess-cold").ID; slices.Contains(after, id) {
		t.Fatalf("an ensure of another class took pooled sandbox %s", id)
	}
	if got := r.a.Pool()[0].IDs; !slices.Equal(got, after) {
		t.Fatalf("the pool changed from %v to %v on an ensure of another class", after, got)
	}

	// Released: destroyed, never back in the pool.
	for _, tn := range tenants {
		if err := e.ctl.Destroy(ctx, hostID, tn.key); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range refs(t, d) {
		if slices.Contains(claimed, ref.ID) {
			t.Fatalf("released sandbox %s (%s) is still there", ref.ID, ref.Key)
		}
	}
	if err := e.ctl.Destroy(ctx, hostID, "sess-cold"); err != nil {
		t.Fatal(err)
	}
}

// TestWarmPoolRefillWaitsForFirstCommandGVisor: the refill after a claim
// waits for the claimed sandbox's first command to end, so that a new
// sandbox's boot does not share the CPU with it. With a hold longer than
// the test, the driver is asked for the refill's sandbox only once that
// command has ended (without the wait, the refill starts as the claim
// ends, before the command is sent), and the pool is full again after it.
func TestWarmPoolRefillWaitsForFirstCommandGVisor(t *testing.T) {
	e, d, _ := gvisorPoolEnv(t)
	e.poolRefillHold = time.Hour
	rec := &orderDriver{Driver: d}
	e.wrap = func(driver.Driver) driver.Driver { return rec }
	r := e.start()
	defer r.stop()
	e.waitPoolHeartbeat(2)
	before := pooled(t, d)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec.note("claim")
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "sess-a", Image: poolImage, Limits: poolLimitsPB()}); err != nil {
		t.Fatal(err)
	}
	claimed := refFor(t, d, "sess-a").ID
	if !slices.Contains(before, claimed) {
		t.Fatalf("sess-a got sandbox %s, not one of the pool's %v", claimed, before)
	}
	if out, res, err := execStream(t, e.sandboxClient(), "sess-a", "sh", "-c", "echo first"); err != nil || res.ExitCode != 0 || out != "first\n" {
		t.Fatalf("the first command: %q %v %v", out, res, err)
	}
	e.waitPoolHeartbeat(2)
	after := pooled(t, d)
	if len(after) != 2 || slices.Contains(after, claimed) {
		t.Fatalf("after the first command the pool holds %v (claimed: %s)", after, claimed)
	}
	got := rec.events()
	got = got[slices.Index(got, "claim"):]
	got = got[:min(3, len(got))] // then the new sandbox's warm-up
	if want := []string{"claim", "exec sess-a", "create pool"}; !slices.Equal(got, want) {
		t.Fatalf("from the claim on, the driver saw %v, want %v", got, want)
	}
	if err := e.ctl.Destroy(ctx, hostID, "sess-a"); err != nil {
		t.Fatal(err)
	}
}

// orderDriver is the containerd driver (Claim and all) that notes, in
// order, the creates it is asked for and the ends of its sandboxes' execs.
type orderDriver struct {
	*containerd.Driver
	mu  sync.Mutex
	log []string
}

func (o *orderDriver) note(ev string) {
	o.mu.Lock()
	o.log = append(o.log, ev)
	o.mu.Unlock()
}

func (o *orderDriver) events() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.log)
}

func (o *orderDriver) Create(ctx context.Context, spec driver.Spec) (driver.Ref, error) {
	what := spec.Key
	if spec.Labels[driver.PoolLabel] != "" {
		what = "pool"
	}
	o.note("create " + what)
	return o.Driver.Create(ctx, spec)
}

func (o *orderDriver) Attach(ctx context.Context, ref driver.Ref) (driver.Sandbox, error) {
	sb, err := o.Driver.Attach(ctx, ref)
	if err != nil {
		return nil, err
	}
	return orderSandbox{Sandbox: sb, o: o, key: ref.Key}, nil
}

type orderSandbox struct {
	driver.Sandbox
	o   *orderDriver
	key string
}

func (s orderSandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.ExecResult, error) {
	defer s.o.note("exec " + s.key)
	return s.Sandbox.Exec(ctx, req)
}

// Environment of the host agent process TestWarmPoolAfterAgentKilledGVisor
// starts: with it set, the helper runs the containerd gVisor driver over
// this state dir with the pool class above.
const helperContainerdDir = "CORRAL_TEST_AGENT_CONTAINERD_DIR"

// helperDriver is the helper agent's driver and pool.
func helperDriver() (driver.Driver, []agent.PoolClass, error) {
	addr := os.Getenv("CORRAL_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = containerd.DefaultAddress
	}
	d, err := containerd.New(context.Background(), containerd.Config{Address: addr, Runtime: containerd.RuntimeGVisor,
		StateDir: os.Getenv(helperContainerdDir)})
	return d, []agent.PoolClass{poolClass}, err
}

// TestWarmPoolAfterAgentKilledGVisor: a host agent killed with SIGKILL
// while its pool is full leaves pooled sandboxes that the next agent over
// the same state dir takes back (the same containers, no new ones, none
// reaped as orphans), and that an agent which no longer keeps the class
// destroys: counted in containerd, by the agent's labels, none is left.
func TestWarmPoolAfterAgentKilledGVisor(t *testing.T) {
	e, d, dir := gvisorPoolEnv(t)
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), helperStateDir+"="+e.stateDir, helperContainerdDir+"="+dir,
		helperAddr+"="+e.addr, helperToken+"="+e.token.Reveal())
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	e.waitPoolHeartbeat(2)
	left := pooled(t, d)
	if len(left) != 2 {
		t.Fatalf("containerd holds pooled sandboxes %v, want 2", left)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	killed = true
	e.wait("the killed agent to disconnect", func(h hostctl.Host) bool { return !h.Connected })

	// The same host again, in process: the pool is what it was.
	e.reapTick = make(chan time.Time)
	e.clock.Set(time.Now().Add(time.Hour)) // past the reaper's grace for every container
	r := e.start()
	got := r.a.Pool()[0].IDs
	slices.Sort(got)
	if !slices.Equal(got, left) {
		t.Fatalf("after the restart the pool holds %v, want the sandboxes left by the killed agent %v\nkilled agent's output:\n%s", got, left, out.String())
	}
	e.reapPass()
	if now := pooled(t, d); !slices.Equal(now, left) {
		t.Fatalf("after a reaper pass containerd holds pooled sandboxes %v, want %v", now, left)
	}
	// A claim works on a recovered sandbox.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "sess-after", Image: poolImage, Limits: poolLimitsPB()}); err != nil {
		t.Fatal(err)
	}
	if id := refFor(t, d, "sess-after").ID; !slices.Contains(left, id) {
		t.Fatalf("the ensure after the restart got %s, not a recovered pool sandbox %v", id, left)
	}
	e.waitPoolHeartbeat(2)
	if err := e.ctl.Destroy(ctx, hostID, "sess-after"); err != nil {
		t.Fatal(err)
	}
	r.stop()

	// An agent without the class destroys what is pooled.
	e.pools = nil
	r = e.start()
	defer r.stop()
	if all := refs(t, d); len(all) != 0 {
		t.Fatalf("an agent without a pool left %d sandboxes: %v", len(all), keys(all))
	}
	if st := r.a.Pool(); len(st) != 0 {
		t.Fatalf("pool = %v", st)
	}
}

// TestWarmPoolGoesFirstUnderPressureGVisor: under memory pressure the
// agent destroys an unclaimed pool sandbox before it evicts any session's
// sandbox, and the pool does not refill within a demand window of that
// (the test's clock stands still), though the pressure is gone.
func TestWarmPoolGoesFirstUnderPressureGVisor(t *testing.T) {
	e, d, _ := gvisorPoolEnv(t)
	e.pools = []agent.PoolClass{{Image: poolImage, Limits: poolClass.Limits, Min: 1, Max: 1}}
	r := e.start()
	defer r.stop()
	e.waitPoolHeartbeat(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Another class, so the pool is not claimed.
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "sess-keep", Image: poolImage,
		Limits: &pb.Limits{CpuMillis: 500, MemoryBytes: 256 << 20, Pids: 64}}); err != nil {
		t.Fatal(err)
	}
	pool := r.a.Pool()[0].IDs
	// Pressure while the host holds more than the session's sandbox.
	e.pressureFn = func(ctx context.Context) (agent.Pressure, error) {
		rs, err := d.List(ctx)
		return agent.Pressure{Memory: len(rs) > 1}, err
	}
	hb := e.heartbeat(r)
	if len(hb.Evictions) != 0 || len(hb.Sandboxes) != 1 || hb.Sandboxes[0].State != pb.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("under pressure with a pooled sandbox: evictions %v, sandboxes %v; want the session's kept", hb.Evictions, hb.Sandboxes)
	}
	if got := pooled(t, d); len(got) != 0 {
		t.Fatalf("pooled sandboxes %v left under pressure (the pool held %v)", got, pool)
	}
	if wp := hb.GetWarmPools(); len(wp) != 1 || wp[0].Ready != 0 {
		t.Fatalf("heartbeat warm pools %v, want the class with none ready", wp)
	}
	// A claim's kick does not refill it either: the ensure goes cold.
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "sess-cold", Image: poolImage, Limits: poolLimitsPB()}); err != nil {
		t.Fatal(err)
	}
	if got := pooled(t, d); len(got) != 0 || slices.Contains(pool, refFor(t, d, "sess-cold").ID) {
		t.Fatalf("after a claim while held: pooled %v", got)
	}
	if err := e.ctl.Destroy(ctx, hostID, "sess-cold"); err != nil {
		t.Fatal(err)
	}
	if err := e.ctl.Destroy(ctx, hostID, "sess-keep"); err != nil {
		t.Fatal(err)
	}
}
