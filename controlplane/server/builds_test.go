package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/test/mirrortest"
)

// TestPackageImageFollowsItsSandbox: an environment's packages are built
// on the only host there is; a drain then moves the session's sandbox to
// a host that never built them and holds no image at all (a containerd
// namespace of its own), which imports the image from the blob store
// (exported after the build), and the session's next turn runs the
// packages there.
func TestPackageImageFollowsItsSandbox(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	mirrors := mirrortest.Serve(t)
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: -1,
		PackageMirrors: []string{"apt=" + mirrors.APT, "pip=" + mirrors.Pip}})
	eg := agent.EgressConfig{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	var built []string
	containerdtest.RemoveBuiltImages(t, containerd.Config{Address: containerdtest.Address(t), Runtime: containerd.RuntimeGVisor}, func() []string { return built })
	startGVisorHostEgress(t, srv, "pkg-a", containerd.Config{Runtime: containerd.RuntimeGVisor}, agent.Resources{}, eg)

	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	ag := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "a", "model": "fake", "tools": []any{map[string]any{
		"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}},
	}}})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "pkgs", "config": map[string]any{"type": "cloud",
		"packages": map[string]any{"apt": []string{mirrortest.AptPackage}}}})
	sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})
	s := &session{t: t, c: c, base: base, id: sess["id"].(string)}
	const probe = `!tool bash {"command":"corral-hello"}`
	if out := toolOutput(t, s.turn(probe)); !strings.Contains(out, mirrortest.HelloOutput) {
		t.Fatalf("on the build's host: %q", out)
	}
	if host, _, _ := placement(srv, s.id); host != "pkg-a" {
		t.Fatalf("the session is on %q", host)
	}

	// The build's image, kept for removal at the end.
	resp, err := c.Get(base + "/admin/v1/builds")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Builds []struct{ Image, Status string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Builds) != 1 || list.Builds[0].Status != "ready" {
		t.Fatalf("builds: %+v, %v", list, err)
	}
	resp.Body.Close()
	built = append(built, list.Builds[0].Image)

	// pkg-b's containerd namespace is its own: it has no image the shared
	// one holds, so the image must come to it through the blob store.
	startGVisorHostEgress(t, srv, "pkg-b", containerd.Config{Runtime: containerd.RuntimeGVisor, Namespace: containerdtest.TempNamespace(t)}, agent.Resources{}, eg)
	last, msgs := drainHost(t, srv, servertest.OperatorKey(t, db), "pkg-a", 2*time.Minute)
	if last.GetMoved() != 1 || last.GetEvicted() != 0 {
		t.Fatalf("drain: last progress %v, messages %q", last, msgs)
	}
	waitfor.Cond(t, time.Minute, "the session on pkg-b", func() bool { host, _, _ := placement(srv, s.id); return host == "pkg-b" })
	if out := toolOutput(t, s.turn(probe)); !strings.Contains(out, mirrortest.HelloOutput) {
		t.Fatalf("on the host the drain moved it to: %q", out)
	}
	if d, _ := mirrors.Downloads(); d != 1 {
		t.Fatalf("the .deb was fetched %d times: the other host built again", d)
	}
}

// TestUnusedBuildsAreSwept: once no session pins a build and nobody asked
// for it since the cutoff, the sweep removes it: its record, its archive
// in the blob store and its image on the host; one a session pins stays.
// A session of the environment after that builds it again.
func TestUnusedBuildsAreSwept(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	mirrors := mirrortest.Serve(t)
	db := pgtest.New(t)
	blobs := t.TempDir()
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: admission.RuntimeGVisor, PauseAfterIdle: -1,
		PackageMirrors: []string{"apt=" + mirrors.APT}, BlobDir: blobs, BuildRetention: time.Hour}) // the test sweeps itself
	var built []string
	containerdtest.RemoveBuiltImages(t, containerd.Config{Address: containerdtest.Address(t), Runtime: containerd.RuntimeGVisor}, func() []string { return built })
	d := startGVisorHostEgress(t, srv, "sweep-a", containerd.Config{Runtime: containerd.RuntimeGVisor}, agent.Resources{},
		agent.EgressConfig{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})

	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	ag := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "a", "model": "fake", "tools": []any{map[string]any{
		"type": "agent_toolset_20260401", "default_config": map[string]any{"permission_policy": map[string]any{"type": "always_allow"}},
	}}})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "pkgs", "config": map[string]any{"type": "cloud",
		"packages": map[string]any{"apt": []string{mirrortest.AptPackage}}}})
	newSession := func() *session {
		sess := postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})
		return &session{t: t, c: c, base: base, id: sess["id"].(string)}
	}
	const probe = `!tool bash {"command":"corral-hello"}`
	s := newSession()
	if out := toolOutput(t, s.turn(probe)); !strings.Contains(out, mirrortest.HelloOutput) {
		t.Fatalf("the session's sandbox: %q", out)
	}
	list := func() []struct{ Image, BlobKey, Status string } {
		resp, err := c.Get(base + "/admin/v1/builds")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct {
			Builds []struct{ Image, BlobKey, Status string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		return l.Builds
	}
	b := list()
	if len(b) != 1 {
		t.Fatalf("builds: %+v", b)
	}
	image := b[0].Image
	built = append(built, image)
	archives := func() int {
		m, _ := filepath.Glob(filepath.Join(blobs, "builds", "*", "*.tar"))
		return len(m)
	}
	if archives() != 1 {
		t.Fatalf("%d image archives in the blob store, want 1", archives())
	}

	// Pinned by its session: kept, whatever the cutoff.
	sweep := func() {
		t.Helper()
		if err := srv.Fleet().SweepBuilds(context.Background(), time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	sweep()
	if len(list()) != 1 || archives() != 1 {
		t.Fatalf("a pinned build was swept: %+v, %d archives", list(), archives())
	}
	if _, err := d.Image(context.Background(), image); err != nil {
		t.Fatalf("the pinned build's image: %v", err)
	}

	req, _ := http.NewRequest("DELETE", base+"/v1/sessions/"+s.id, nil)
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	sweep()
	if b := list(); len(b) != 0 {
		t.Fatalf("after the sweep: %+v", b)
	}
	if n := archives(); n != 0 {
		t.Fatalf("%d image archives left in the blob store", n)
	}
	if _, err := d.Image(context.Background(), image); !errdefs.IsNotFound(err) {
		t.Fatalf("the swept build's image on the host: %v", err)
	}

	// The environment's next session builds again.
	if out := toolOutput(t, newSession().turn(probe)); !strings.Contains(out, mirrortest.HelloOutput) {
		t.Fatalf("a session after the sweep: %q", out)
	}
	if d, _ := mirrors.Downloads(); d != 2 {
		t.Fatalf("the .deb was fetched %d times, want 2 (built again after the sweep)", d)
	}
}
