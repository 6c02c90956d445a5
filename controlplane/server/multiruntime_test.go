package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// startMultiHost joins a host agent that offers gvisor (its default) and
// runc, each run by its own containerd driver, as `corral host --runtime
// gvisor,runc` does; the gvisor provider's canary runs a runsc the test
// can break, on a ticker it drives.
func startMultiHost(t *testing.T, srv *server.Server, id string, labels map[string]string) *providerHost {
	t.Helper()
	gv := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: t.TempDir()})
	rc := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeRunc, StateDir: t.TempDir()})
	h := &providerHost{id: id, runsc: filepath.Join(t.TempDir(), "runsc"), tick: make(chan time.Time)}
	if err := os.WriteFile(h.runsc, []byte("#!/bin/sh\nexec "+containerd.DefaultRunscPath+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	gp, err := agent.NewProvider("gvisor", agent.ProviderConfig{Driver: gv, Binary: h.runsc, CanaryImage: server.DefaultSandboxImage})
	if err != nil {
		t.Fatal(err)
	}
	rp, err := agent.NewProvider("runc", agent.ProviderConfig{Driver: rc, CanaryImage: server.DefaultSandboxImage})
	if err != nil {
		t.Fatal(err)
	}
	joinAgent(t, srv, agent.Config{
		HostID: id, Labels: labels,
		Runtimes:        []agent.RuntimeDriver{{Name: containerd.RuntimeGVisor, Driver: gv}, {Name: containerd.RuntimeRunc, Driver: rc}},
		Providers:       []agent.Provider{gp, rp},
		NewCanaryTicker: func(time.Duration) (<-chan time.Time, func()) { return h.tick, func() {} },
		ReconnectDelay:  50 * time.Millisecond,
	})
	return h
}

// One host offers two providers, gvisor and runc, each run by its own
// driver. Sessions of each class land on it with their class's provider
// and really run under it (gVisor's kernel answers /proc/version in one,
// the host's in the other). When its gvisor provider fails its canary,
// the host takes no new gvisor placement (they go to the other gVisor
// host) while it still takes runc ones and its running gvisor session
// keeps answering; ListHosts shows both providers and why one is out.
func TestOneHostOffersSeveralProviders(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "gvisor", PolicyDir: classesPolicy(t)})
	multi := startMultiHost(t, srv, "multi", map[string]string{"pool": "dedicated"})
	admin := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))

	got := listHost(t, admin, "multi")
	var names []string
	for _, p := range got.GetProviderDetails() {
		names = append(names, p.GetName()+"/"+p.GetIsolation())
	}
	if strings.Join(names, ",") != "gvisor/user_kernel,runc/container" || !got.GetSchedulable() {
		t.Fatalf("ListHosts for a host of two providers: %v", got)
	}

	hostKernel, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	acme := newTenantClient(t, srv, "tenant_acme")
	trustedEnv := classEnv(t, acme, "trusted", 200)
	kernel := func(who, id string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := acme.toolTurn(ctx, id, `!tool bash {"command":"cat /proc/version"}`)
		if err != nil || !strings.Contains(out, "Linux version") {
			t.Fatalf("%s: /proc/version %q %v", who, out, err)
		}
		return strings.TrimSpace(out)
	}
	gvisorSession := acme.newSession(t)
	if k := kernel("gvisor session", gvisorSession); k == strings.TrimSpace(string(hostKernel)) {
		t.Fatalf("the gvisor session sees the host's kernel: %q", k)
	}
	if host, provider := placementProvider(srv, gvisorSession); host != "multi" || provider != "gvisor" {
		t.Fatalf("acme's default session on %s (%s), want multi (gvisor)", host, provider)
	}
	runcSession := classSession(t, acme, trustedEnv, "trusted", 200)
	if k := kernel("runc session", runcSession); k != strings.TrimSpace(string(hostKernel)) {
		t.Fatalf("the runc session's kernel is %q, want the host's %q", k, hostKernel)
	}
	if host, provider := placementProvider(srv, runcSession); host != "multi" || provider != "runc" {
		t.Fatalf("acme's trusted session on %s (%s), want multi (runc)", host, provider)
	}

	// Its gvisor provider broken: gvisor sessions go to another gVisor host
	// of acme's pools, runc ones still come here.
	startRuntimeHost(t, srv, "plain", containerd.RuntimeGVisor, map[string]string{"pool": "shared"})
	multi.setBroken(t, true)
	waitfor.Cond(t, 30*time.Second, "multi's gvisor provider to be recorded failing", func() bool {
		o, _ := fsmHost(srv, "multi").Offer("gvisor")
		return !o.Healthy
	})
	got = listHost(t, admin, "multi")
	if !got.GetSchedulable() {
		t.Fatalf("a host whose runc provider passes is not schedulable: %v", got)
	}
	for _, p := range got.GetProviderDetails() {
		switch p.GetName() {
		case "gvisor":
			if p.GetHealthy() || !strings.Contains(p.GetReason(), "broken by the test") {
				t.Fatalf("the broken gvisor provider as listed: %v", p)
			}
		case "runc":
			if !p.GetHealthy() {
				t.Fatalf("the runc provider as listed: %v", p)
			}
		}
	}
	second := acme.newSession(t)
	kernel("a gvisor session while multi's gvisor is broken", second)
	if host, provider := placementProvider(srv, second); host != "plain" || provider != "gvisor" {
		t.Fatalf("a gvisor session while multi's gvisor provider fails: on %s (%s), want plain", host, provider)
	}
	secondRunc := classSession(t, acme, trustedEnv, "trusted", 200)
	kernel("a runc session while multi's gvisor is broken", secondRunc)
	if host, provider := placementProvider(srv, secondRunc); host != "multi" || provider != "runc" {
		t.Fatalf("a runc session while multi's gvisor provider fails: on %s (%s), want multi (runc)", host, provider)
	}
	if k := kernel("the running gvisor session", gvisorSession); k == strings.TrimSpace(string(hostKernel)) {
		t.Fatalf("the running gvisor session sees the host's kernel: %q", k)
	}
	multi.setBroken(t, false)
	waitfor.Cond(t, 30*time.Second, "multi's gvisor provider to be recorded healthy", func() bool {
		o, _ := fsmHost(srv, "multi").Offer("gvisor")
		return o.Healthy
	})
}
