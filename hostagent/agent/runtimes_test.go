package agent_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/driver/drivertest"
	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/errdefs"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

func (e *env) ensureRuntime(key, runtime string) (*pb.SandboxStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: key, Image: "img", Runtime: runtime})
}

func keysOf(t *testing.T, f *drivertest.Fake) string {
	t.Helper()
	var keys []string
	for _, r := range refs(t, f) {
		keys = append(keys, r.Key)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// A host of two runtimes, each run by its own driver: it registers both
// with a provider each; an ensure is made by its runtime's driver (the
// first, the default, when it names none) and refused for a runtime the
// host does not run or for a key whose sandbox has another runtime; each
// sandbox is reached, re-attached after a restart and destroyed through
// its own driver; and a sandbox of a runtime taken out of the host's
// configuration is reported lost, not attached by another driver.
func TestHostOfSeveralRuntimes(t *testing.T) {
	e := setup(t)
	other := e.fake.Named("fake-other")
	e.more = []agent.RuntimeDriver{{Name: "other", Driver: other}}
	r := e.start()
	reg := e.ctl.Hosts()[hostID].Register
	var providers []string
	for _, p := range reg.Providers {
		providers = append(providers, p.GetName())
	}
	if strings.Join(reg.Runtimes, ",") != "fake,other" || strings.Join(providers, ",") != "fake,other" {
		t.Fatalf("registered runtimes %v and providers %v, want fake,other for both", reg.Runtimes, providers)
	}
	for _, c := range []struct{ key, runtime, provider string }{
		{"a", "fake", "fake"}, {"b", "other", "fake-other"}, {"c", "", "fake"},
	} {
		st, err := e.ensureRuntime(c.key, c.runtime)
		if err != nil || st.GetProvider() != c.provider {
			t.Fatalf("ensure %s of runtime %q: %v %v, want provider %s", c.key, c.runtime, st, err, c.provider)
		}
	}
	if _, err := e.ensureRuntime("x", "gvisor"); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "fake, other") {
		t.Fatalf("ensure of a runtime the host does not run: %v, want invalid argument naming fake, other", err)
	}
	if _, err := e.ensureRuntime("a", "other"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "runtime fake, not other") {
		t.Fatalf("ensure of a's key with another runtime: %v, want failed precondition", err)
	}
	if got, want := keysOf(t, e.fake), "a,c"; got != want {
		t.Fatalf("the default runtime's driver holds %s, want %s", got, want)
	}
	if got, want := keysOf(t, other), "b"; got != want {
		t.Fatalf("the other runtime's driver holds %s, want %s", got, want)
	}
	c := e.sandboxClient()
	ctx := context.Background()
	if _, err := c.WriteFile(ctx, &pb.WriteFileRequest{Key: "b", Path: "n.txt", Data: []byte("other's")}); err != nil {
		t.Fatal(err)
	}
	if out, _, err := execStream(t, c, "b", "echo", "from", "b"); err != nil || out != "from b\n" {
		t.Fatalf("exec in b: %q %v", out, err)
	}
	before := refs(t, other)[0].ID

	// A restart re-attaches each sandbox through its own driver.
	r.stop()
	e.wait("disconnect", func(h hostctl.Host) bool { return !h.Connected })
	r = e.start()
	if after := refs(t, other); len(after) != 1 || after[0].ID != before {
		t.Fatalf("after the restart the other driver holds %v, want %s re-attached", after, before)
	}
	c = e.sandboxClient()
	if got, err := c.ReadFile(ctx, &pb.ReadFileRequest{Key: "b", Path: "n.txt"}); err != nil || string(got.Data) != "other's" {
		t.Fatalf("b's file after the restart: %v %v", got, err)
	}
	if hb := e.heartbeat(r); len(hb.Sandboxes) != 3 {
		t.Fatalf("heartbeat sandboxes %v, want a, b and c", hb.Sandboxes)
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := e.ctl.Destroy(dctx, hostID, "b"); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(t, other); got != "" {
		t.Fatalf("after destroying b the other driver holds %s", got)
	}
	if got := keysOf(t, e.fake); got != "a,c" {
		t.Fatalf("destroying b changed the default driver's sandboxes: %s", got)
	}

	// The runtime taken out: its sandbox is lost to the host, and no other
	// driver attaches it.
	if _, err := e.ensureRuntime("b", "other"); err != nil {
		t.Fatal(err)
	}
	r.stop()
	e.wait("disconnect", func(h hostctl.Host) bool { return !h.Connected })
	e.more = nil
	r = e.start()
	defer r.stop()
	for _, st := range e.ctl.Hosts()[hostID].Register.Sandboxes {
		switch st.Key {
		case "b":
			if st.State != pb.SandboxState_SANDBOX_STATE_FAILED || !strings.Contains(st.Message, "provider fake-other does not run on this host") {
				t.Fatalf("b after its runtime was taken out: %v, want failed saying why", st)
			}
		default:
			if st.State != pb.SandboxState_SANDBOX_STATE_READY {
				t.Fatalf("%s after another runtime was taken out: %v", st.Key, st)
			}
		}
	}
	if got := keysOf(t, other); got != "b" {
		t.Fatalf("the other runtime's sandbox was touched by the host that no longer runs it: %q", got)
	}
}

// The runtimes' configuration is checked: every runtime named once, with a
// driver, each driver of its own provider name, each with a provider.
func TestRuntimesConfigRefused(t *testing.T) {
	e := setup(t)
	other := e.fake.Named("fake-other")
	cases := map[string][]agent.RuntimeDriver{
		"twice":          {{Name: "fake", Driver: e.fake}, {Name: "fake", Driver: other}},
		"no name":        {{Name: "fake", Driver: e.fake}, {Name: "", Driver: other}},
		"no driver":      {{Name: "fake", Driver: e.fake}, {Name: "other"}},
		"one provider":   {{Name: "fake", Driver: e.fake}, {Name: "other", Driver: e.fake.Reopen()}},
		"no provider of": {{Name: "fake", Driver: e.fake}, {Name: "other", Driver: other}},
	}
	for name, rs := range cases {
		cfg := e.config()
		cfg.Runtimes = rs
		if name == "no provider of" {
			cfg.Providers = []agent.Provider{mustProvider(t, "process")}
		}
		if _, err := agent.New(context.Background(), cfg); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

func mustProvider(t *testing.T, name string) agent.Provider {
	t.Helper()
	p, err := agent.NewProvider(name, agent.ProviderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Under memory pressure a host of two runtimes, one of whose drivers
// cannot pause, pauses the idle sandboxes of the one that can and evicts
// only the other's: a sandbox whose driver cannot pause is no reason to
// evict those that can, though it has been idle longest.
func TestPressurePausesWhatItCanOnAHostOfTwoRuntimes(t *testing.T) {
	e := setup(t)
	other := e.fake.Named("fake-other")
	e.more = []agent.RuntimeDriver{{Name: "other", Driver: other}}
	e.wrapMore = func(d driver.Driver) driver.Driver { return noPause{d} }
	r := e.start()
	defer r.stop()
	for _, s := range []struct{ key, runtime string }{{"r-1", "other"}, {"g-1", "fake"}, {"g-2", "fake"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: s.key, Image: "img", Runtime: s.runtime, Tenant: "t",
			Limits: &pb.Limits{CpuMillis: 100, MemoryBytes: 64 << 20}})
		cancel()
		if err != nil {
			t.Fatalf("ensuring %s: %v", s.key, err)
		}
		e.clock.Advance(time.Minute)
	}
	e.pressure.Store(true)
	hb := e.heartbeat(r)
	if got := strings.Join(pauseKeys(hb), ","); got != "g-1,g-2" {
		t.Errorf("paused %q, want g-1,g-2 (the pausable runtime's)", got)
	}
	if got := strings.Join(evictionKeys(hb), ","); got != "r-1" {
		t.Errorf("evicted %q, want only r-1 (its driver cannot pause)", got)
	}
}

// A warm pool class of one runtime on a host of two (gVisor its default,
// runc beside it) is filled by that runtime's driver and reported with its
// runtime; an ensure of that runtime claims from it, and an ensure of the
// same image and limits but the other runtime is created cold by its own
// driver: a gVisor session never gets a runc sandbox from a pool.
func TestWarmPoolOfOneRuntimeServesOnlyItGVisor(t *testing.T) {
	gv := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir()})
	rc := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeRunc, StateDir: t.TempDir()})
	e := setup(t)
	e.wrap = func(driver.Driver) driver.Driver { return gv }
	e.more = []agent.RuntimeDriver{{Name: containerd.RuntimeRunc, Driver: rc}}
	class := poolClass
	class.Runtime, class.Min, class.Max = containerd.RuntimeRunc, 1, 1
	e.pools = []agent.PoolClass{class}
	r := e.start()
	defer r.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := e.ctl.Wait(ctx, func(hs map[string]hostctl.Host) bool {
		wp := hs[hostID].Last.GetWarmPools()
		return len(wp) == 1 && wp[0].Ready == 1 && wp[0].Runtime == containerd.RuntimeRunc
	})
	if err != nil {
		t.Fatalf("waiting for the runc pool's sandbox: %v (last: %v)", err, e.ctl.Hosts()[hostID].Last.GetWarmPools())
	}
	warm := pooled(t, rc)
	if len(warm) != 1 || len(pooled(t, gv)) != 0 {
		t.Fatalf("pooled: runc %v, gvisor %v; want one runc sandbox only", warm, pooled(t, gv))
	}
	// The gVisor ensure first, while the runc pool holds its sandbox. The
	// env names its default runtime "fake"; gv runs it.
	for _, c := range []struct{ rt, name string }{{containerd.RuntimeGVisor, ""}, {containerd.RuntimeRunc, containerd.RuntimeRunc}} {
		if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s-" + c.rt, Image: poolImage, Runtime: c.name, Limits: poolLimitsPB()}); err != nil {
			t.Fatalf("ensure of runtime %s: %v", c.rt, err)
		}
	}
	if got := refFor(t, gv, "s-gvisor"); slices.Contains(warm, got.ID) {
		t.Fatalf("the gvisor session got the runc pool's sandbox %s", got.ID)
	}
	if got := refFor(t, rc, "s-runc"); !slices.Contains(warm, got.ID) {
		t.Fatalf("the runc session's sandbox %s is not the pooled %v", got.ID, warm)
	}
	c := e.sandboxClient()
	hostKernel, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range []string{containerd.RuntimeGVisor, containerd.RuntimeRunc} {
		out, _, err := execStream(t, c, "s-"+rt, "cat", "/proc/version")
		if err != nil {
			t.Fatalf("exec in s-%s: %v", rt, err)
		}
		if (out == string(hostKernel)) != (rt == containerd.RuntimeRunc) {
			t.Fatalf("s-%s runs on kernel %q (the host's: %q)", rt, out, hostKernel)
		}
	}
	for _, rt := range []string{containerd.RuntimeGVisor, containerd.RuntimeRunc} {
		if err := e.ctl.Destroy(ctx, hostID, "s-"+rt); err != nil {
			t.Fatal(err)
		}
	}
}
