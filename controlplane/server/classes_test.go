package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/policy"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// The fleet's policy in these tests: pools shared and dedicated (acme's),
// acme and dev allowed classes of their own, acme granted runc.
const (
	classesPlacement = `
host_pools:
  shared: {shared: true}
  dedicated: {tenant: tenant_acme}
  batch: {}
tenant_placement:
  tenant_acme: {pools: [dedicated, shared]}
  tenant_default: {spread_zones: true}
  tenant_batch: {pools: [batch]}
`
	classesYAML = `
sandbox_classes:
  gvisor: {runtime: gvisor}
  runc: {runtime: runc}
  process: {runtime: process}
  trusted: {runtime: runc, cpu_millis: 2000}
tenant_classes:
  tenant_acme: {classes: [gvisor, trusted], default: gvisor}
  tenant_dev: {classes: [process, gvisor], default: process}
`
)

// classesPolicy is a policy directory with the shipped roles, quotas
// (acme granted runc) and runtimes (without warm pools: no host boots a
// sandbox before a session asks), and the placement and classes above.
func classesPolicy(t *testing.T) string {
	t.Helper()
	runtimes, err := os.ReadFile(filepath.Join("..", "..", "policy", "runtimes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	noWarm := strings.Replace(string(runtimes), "min: 2\n    max: 4", "min: 0\n    max: 0", 1)
	if noWarm == string(runtimes) {
		t.Fatal("the shipped runtimes.yaml has no warm pool of min 2, max 4 to empty")
	}
	dir := policyDir(t, noWarm)
	quotas, err := os.ReadFile(filepath.Join(dir, "quotas.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	granted := strings.Replace(string(quotas), "trusted_runtimes: {}", "trusted_runtimes:\n  tenant_acme: [runc]", 1)
	if granted == string(quotas) {
		t.Fatal("the shipped quotas.yaml has no trusted_runtimes: {} to edit")
	}
	for name, body := range map[string]string{"quotas.yaml": granted, policy.PlacementFile: classesPlacement, policy.ClassesFile: classesYAML} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startRuntimeHost joins a host agent id with labels over a containerd
// driver of runtime (gvisor or runc), with room for many sandboxes.
func startRuntimeHost(t *testing.T, srv *server.Server, id, runtime string, labels map[string]string) {
	t.Helper()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: runtime, StateDir: t.TempDir()})
	joinAgent(t, srv, agent.Config{
		HostID: id, Driver: d, Runtime: runtime, Labels: labels,
		ReconnectDelay: 50 * time.Millisecond,
	})
}

// post sends v to url and returns the status and the body (bounded).
func postStatus(t *testing.T, c *http.Client, url string, v any) (int, map[string]any, string) {
	t.Helper()
	b, _ := json.Marshal(v)
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out, string(raw)
}

// classEnv creates an environment of tc whose sessions get class (""
// for none) and returns its id, or fails unless the create answers want,
// whose message must then name the class.
func classEnv(t *testing.T, tc *tenantClient, class string, want int) string {
	t.Helper()
	body := map[string]any{"name": fmt.Sprintf("e-%s-%d", class, time.Now().UnixNano())}
	if class != "" {
		body["metadata"] = map[string]string{policy.ClassMetadataKey: class}
	}
	code, out, raw := postStatus(t, tc.c, tc.base+"/v1/environments", body)
	if code != want {
		t.Fatalf("environment of class %q: %d %s, want %d", class, code, raw, want)
	}
	if want != 200 {
		if !strings.Contains(raw, class) {
			t.Fatalf("environment of class %q: the refusal does not name it: %s", class, raw)
		}
		return ""
	}
	if md, _ := out["metadata"].(map[string]any); class != "" && md[policy.ClassMetadataKey] != class {
		t.Fatalf("environment metadata %v, want the class key kept as sent", out["metadata"])
	}
	return out["id"].(string)
}

// classSession creates a session of tc in env and returns its id, or fails
// unless the create answers want (naming class when refused).
func classSession(t *testing.T, tc *tenantClient, env, class string, want int) string {
	t.Helper()
	code, out, raw := postStatus(t, tc.c, tc.base+"/v1/sessions", map[string]any{"agent": tc.agent, "environment_id": env})
	if code != want {
		t.Fatalf("session in the environment of class %q: %d %s, want %d", class, code, raw, want)
	}
	if want != 200 {
		if !strings.Contains(raw, "sandbox class "+class) {
			t.Fatalf("session of class %q: the refusal does not name it: %s", class, raw)
		}
		return ""
	}
	return out["id"].(string)
}

// sessionCount is how many sessions tc's tenant has.
func sessionCount(t *testing.T, tc *tenantClient) int {
	t.Helper()
	resp, err := tc.c.Get(tc.base + "/v1/sessions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []any `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return len(out.Data)
}

// placedWith runs a tool call in session id of tc and returns its
// placement's host and provider.
func placedWith(t *testing.T, srv *server.Server, tc *tenantClient, id, who string) (host, provider string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := tc.toolTurn(ctx, id, echoOK); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("%s: tool call %q %v", who, out, err)
	}
	return placementProvider(srv, id)
}

func placementProvider(srv *server.Server, id string) (host, provider string) {
	srv.Raft().Read(func(v raftfsm.View) {
		if p, ok := v.Placement(id); ok {
			host, provider = p.HostID, p.Provider
		}
	})
	return host, provider
}

// A heterogeneous fleet on this machine, every host a real host agent over
// a real runtime: two gVisor hosts in pool shared (zones a and b), one
// gVisor host in pool dedicated (acme's), one runc host and one process
// host. Each tenant's sessions get their class (its default, or the one
// their environment names) and land where the class and the pools say;
// another tenant's session never lands on the dedicated host; a class
// unknown, not allowed, or that no host offers is refused with a 4xx
// naming it before anything is stored; and a drain moves a session only to
// a host of its class's provider, though hosts of other providers have
// room in its pools.
func TestHeterogeneousFleetPlacesEachClass(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "gvisor", PolicyDir: classesPolicy(t)})
	start := time.Now()
	startRuntimeHost(t, srv, "shared-a", containerd.RuntimeGVisor, map[string]string{"pool": "shared", "zone": "a"})
	startRuntimeHost(t, srv, "shared-b", containerd.RuntimeGVisor, map[string]string{"pool": "shared", "zone": "b"})
	startRuntimeHost(t, srv, "dedicated", containerd.RuntimeGVisor, map[string]string{"pool": "dedicated", "zone": "a"})
	startHostWith(t, srv, "proc", func(c *agent.Config) { c.Labels = map[string]string{"pool": "shared", "zone": "b"} })
	t.Logf("four hosts joined in %v", time.Since(start))

	acme := newTenantClient(t, srv, "tenant_acme")
	other := newTenantClient(t, srv, tenant.Default)
	dev := newTenantClient(t, srv, "tenant_dev")

	// Refused when the environment is created: a class nobody defined
	// (400), a class this tenant may not use (403).
	classEnv(t, other, "gpu-large", 400)
	classEnv(t, other, "trusted", 403)
	classEnv(t, dev, "trusted", 403)

	// No runc host has joined: acme may use class trusted, but a session
	// of it is refused (409) naming it, and nothing is stored.
	trustedEnv := classEnv(t, acme, "trusted", 200)
	classSession(t, acme, trustedEnv, "trusted", 409)
	if n := sessionCount(t, acme); n != 0 {
		t.Fatalf("acme has %d sessions after the refusal, want none stored", n)
	}
	startRuntimeHost(t, srv, "runc", containerd.RuntimeRunc, map[string]string{"pool": "shared", "zone": "a"})

	check := func(who, id, wantHost, wantProvider string) {
		t.Helper()
		t0 := time.Now()
		host, provider := placedWith(t, srv, acmeOr(who, acme, other, dev), id, who)
		if host != wantHost || provider != wantProvider {
			t.Fatalf("%s: on host %s with provider %s, want %s with %s", who, host, provider, wantHost, wantProvider)
		}
		t.Logf("%s: placed on %s (%s), first tool call in %v", who, host, provider, time.Since(t0))
	}
	// acme: its default class (gvisor) on its dedicated host; class
	// trusted, chosen by the environment, on the runc host.
	check("acme", acme.newSession(t), "dedicated", "gvisor")
	check("acme trusted", classSession(t, acme, trustedEnv, "trusted", 200), "runc", "runc")
	// The default tenant: gvisor, spread over the shared zones, never on
	// the dedicated host (though it is as empty) nor on the runc or process
	// hosts of its shared pool.
	first, second := other.newSession(t), other.newSession(t)
	if host, provider := placedWith(t, srv, other, first, "other"); provider != "gvisor" || (host != "shared-a" && host != "shared-b") {
		t.Fatalf("the default tenant's session on %s (%s), want a shared gVisor host", host, provider)
	}
	drained, _ := placementProvider(srv, first)
	kept := map[string]string{"shared-a": "shared-b", "shared-b": "shared-a"}[drained]
	check("other again", second, kept, "gvisor") // the other zone
	// dev: its default class, process, on the process host; gvisor when
	// its environment names it.
	check("dev", dev.newSession(t), "proc", "process")
	gvisorEnv := classEnv(t, dev, "gvisor", 200)
	devGVisor := classSession(t, dev, gvisorEnv, "gvisor", 200)
	if host, provider := placedWith(t, srv, dev, devGVisor, "dev gvisor"); provider != "gvisor" || (host != "shared-a" && host != "shared-b") {
		t.Fatalf("dev's gvisor session on %s (%s), want a shared gVisor host", host, provider)
	}

	// A drain of the first session's host moves it only to a gVisor host
	// it may use: the other shared one, not the runc or process host of
	// its pool, which have room, nor the dedicated one.
	drain(t, srv, db, drained, time.Minute)
	if host, provider := placementProvider(srv, first); host != kept || provider != "gvisor" {
		t.Fatalf("after draining %s the session is on %s (%s), want %s (gvisor)", drained, host, provider, kept)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := other.toolTurn(ctx, first, echoOK); err != nil || !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatalf("after the move: %q %v", out, err)
	}
	// No other tenant's session ever reached the dedicated host.
	srv.Raft().Read(func(v raftfsm.View) {
		for _, p := range v.Placements() {
			if p.HostID == "dedicated" && p.Tenant != "tenant_acme" {
				t.Errorf("session %s of %s is on acme's dedicated host", p.SessionID, p.Tenant)
			}
		}
	})
	t.Logf("whole fleet test in %v", time.Since(start))
}

// acmeOr picks the client of who's tenant.
func acmeOr(who string, acme, other, dev *tenantClient) *tenantClient {
	switch {
	case strings.HasPrefix(who, "acme"):
		return acme
	case strings.HasPrefix(who, "dev"):
		return dev
	}
	return other
}

// startClaimingHost starts a process-driver host agent that claims
// runtime (its provider of that name has no canary): for the scheduling
// tests, where what runs the sandbox does not matter.
func startClaimingHost(t *testing.T, srv *server.Server, id, runtime string, labels map[string]string) (stop func()) {
	t.Helper()
	_, stop = startHostWith(t, srv, id, func(c *agent.Config) { c.Runtime, c.Labels = runtime, labels })
	return stop
}

// A session of class trusted (runc) whose host is lost is rescheduled to
// another runc host only: while none is up it is not placed on the gVisor
// host that is, and once a runc host joins the session runs there. Hosts
// here are process agents claiming the runtimes: the test is about where
// placements go, not what runs them.
func TestHostLossKeepsTheClassProvider(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "gvisor", PolicyDir: classesPolicy(t),
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: time.Second})
	stopRunc := startClaimingHost(t, srv, "runc-1", "runc", map[string]string{"pool": "shared"})
	startClaimingHost(t, srv, "gvisor-1", "gvisor", map[string]string{"pool": "shared"})
	acme := newTenantClient(t, srv, "tenant_acme")
	env := classEnv(t, acme, "trusted", 200)
	id := classSession(t, acme, env, "trusted", 200)
	if host, provider := placedWith(t, srv, acme, id, "acme trusted"); host != "runc-1" || provider != "runc" {
		t.Fatalf("acme's trusted session on %s (%s), want runc-1", host, provider)
	}
	late := classSession(t, acme, env, "trusted", 200) // no tool call yet
	stopRunc()
	// The host service reschedules at every check of the down host; with
	// no runc host the placement stays on runc-1, which is down.
	waitfor.Cond(t, 30*time.Second, "runc-1 to be down", func() bool {
		down := false
		srv.Raft().Read(func(v raftfsm.View) {
			h, ok := v.Host("runc-1")
			down = ok && h.Status == scheduler.StatusDown
		})
		return down
	})
	if host, _ := placementProvider(srv, id); host == "gvisor-1" {
		t.Fatal("the trusted session was rescheduled to a gVisor host")
	}
	// A host that is down offers nothing: a new session of the class is
	// refused.
	classSession(t, acme, env, "trusted", 409)
	// A session of the class without a sandbox yet: its tool call is
	// refused naming the class no host offers now, and not placed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := acme.toolTurn(ctx, late, echoOK); err == nil || !strings.Contains(err.Error()+out, "offers this session's sandbox class trusted (provider runc)") {
		t.Fatalf("a trusted session's tool call with no runc host up: %q %v", out, err)
	}
	if host, _ := placementProvider(srv, late); host != "" {
		t.Fatalf("the trusted session was placed on %s", host)
	}
	startClaimingHost(t, srv, "runc-2", "runc", map[string]string{"pool": "shared"})
	waitfor.Cond(t, 30*time.Second, "the session to be rescheduled to runc-2", func() bool {
		host, _ := placementProvider(srv, id)
		return host == "runc-2"
	})
	if _, provider := placementProvider(srv, id); provider != "runc" {
		t.Fatalf("rescheduled with provider %s, want runc", provider)
	}
	// An operator's eviction: the next tool call places the session anew
	// from its class, on the runc host again, not the emptier gVisor one.
	admin := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	if _, err := admin.EvictSandbox(context.Background(), &adminv1.EvictSandboxRequest{SessionId: id}); err != nil {
		t.Fatal(err)
	}
	startClaimingHost(t, srv, "gvisor-2", "gvisor", map[string]string{"pool": "shared"})
	if _, err := acme.toolTurn(ctx, id, echoOK); err != nil {
		t.Fatal(err)
	}
	if host, provider := placementProvider(srv, id); host != "runc-2" || provider != "runc" {
		t.Fatalf("after the eviction the session is on %s (%s), want runc-2", host, provider)
	}
}

// An environment's class is checked when the environment changes too;
// a session keeps the class it was created with, and one created before
// classes (no class stored) gets its tenant's default when placed.
func TestEnvironmentClassIsCheckedOnUpdate(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "gvisor", PolicyDir: classesPolicy(t)})
	startClaimingHost(t, srv, "gvisor-1", "gvisor", nil)
	startHost(t, srv, "proc-1")
	other := newTenantClient(t, srv, "tenant_dev")
	url := other.base + "/v1/environments/" + other.env
	for _, c := range []struct {
		class string
		want  int
	}{{"nope", 400}, {"trusted", 403}, {"gvisor", 200}} {
		code, _, raw := postStatus(t, other.c, url, map[string]any{"metadata": map[string]string{policy.ClassMetadataKey: c.class}})
		if code != c.want || c.want != 200 && !strings.Contains(raw, c.class) {
			t.Fatalf("setting class %s: %d %s, want %d naming it", c.class, code, raw, c.want)
		}
	}
	// A tenant bound to pool batch, which has no host: the gVisor host
	// offers its class but is not one it may use.
	batch := newTenantClient(t, srv, "tenant_batch")
	classSession(t, batch, batch.env, "gvisor", 409)
	// Renaming an environment whose class is unchanged asks nothing.
	if code, _, raw := postStatus(t, other.c, url, map[string]any{"name": "renamed"}); code != 200 {
		t.Fatalf("renaming: %d %s", code, raw)
	}
	kept := other.newSession(t) // of class gvisor, as its environment says
	id := other.newSession(t)
	conn, err := pgx.Connect(context.Background(), db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "UPDATE sessions SET sandbox_class = '' WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
	// The environment's class changes to the tenant's default (process):
	// the session created before keeps gvisor.
	if code, _, raw := postStatus(t, other.c, url, map[string]any{"metadata": map[string]any{policy.ClassMetadataKey: nil}}); code != 200 {
		t.Fatalf("removing the class: %d %s", code, raw)
	}
	if host, provider := placedWith(t, srv, other, kept, "a session of class gvisor"); host != "gvisor-1" || provider != "gvisor" {
		t.Fatalf("a session of class gvisor on %s (%s), want gvisor-1", host, provider)
	}
	if host, provider := placedWith(t, srv, other, id, "a session without a class"); host != "proc-1" || provider != "process" {
		t.Fatalf("a session without a class on %s (%s), want its tenant's default class's proc-1", host, provider)
	}
}
