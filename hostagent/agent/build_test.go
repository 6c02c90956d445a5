package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/waitfor"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
	"corral.dev/corral/test/mirrortest"
)

const (
	debianImage = "localhost/corral/debian:bookworm-2"
	helloOutput = mirrortest.HelloOutput
	pipValue    = mirrortest.PipValue
)

// buildRequest is what the control plane sends for an environment with
// packages {apt: [aptPkg], pip: ["corralpkg"]} and the test's mirrors.
func buildRequest(ref string, m mirrortest.Mirrors, aptPkg string) *pb.BuildImageRequest {
	return &pb.BuildImageRequest{
		Ref: ref, BaseImage: debianImage, AllowedHosts: []string{"localhost"}, Tenant: "ten_1", AuditId: "envb_" + ref[len(ref)-8:],
		Steps: []*pb.BuildStep{
			{Name: "apt", Files: map[string][]byte{"/etc/apt/sources.list.d/corral-mirror.list": []byte("deb " + m.APT + "\n")},
				Command: []string{"sh", "-c", "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources && apt-get update && apt-get install -y --no-install-recommends " + aptPkg + " && apt-get clean && rm -rf /var/lib/apt/lists/*"}},
			{Name: "pip", Command: []string{"python3", "-m", "pip", "install", "--no-cache-dir", "--break-system-packages", "--index-url", m.Pip, "corralpkg"}},
		},
	}
}

// newRef is a fresh build ref (the images share the test containerd's
// namespace), removed from containerd when the test ends.
func newRef(t *testing.T, d *containerd.Driver) string {
	t.Helper()
	var b [32]byte
	_, _ = rand.Read(b[:])
	ref := "corral.build/" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _ = d.Client().ImageService().Delete(context.Background(), ref) })
	return ref
}

// runBuild runs a build to its end and returns its log lines and result.
func runBuild(t *testing.T, c pb.SandboxServiceClient, req *pb.BuildImageRequest) ([]string, *pb.BuildImageResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	st, err := c.BuildImage(ctx, req)
	if err != nil {
		return nil, nil, errgrpc.FromStatus(err)
	}
	var lines []string
	var res *pb.BuildImageResult
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return lines, nil, errgrpc.FromStatus(err)
		}
		if res != nil {
			t.Fatal("a message after the result")
		}
		if l, ok := m.Msg.(*pb.BuildImageResponse_Log); ok {
			lines = append(lines, l.Log)
		}
		res = m.GetResult()
	}
	if res == nil {
		t.Fatal("the build ended without a result")
	}
	return lines, res, nil
}

// buildEnv is an agent over a gVisor containerd driver whose egress may
// dial 127.0.0.1 (as corral dev's --egress-allow-cidr 127.0.0.1/32).
type buildEnv struct {
	*env
	d        *containerd.Driver
	stateDir string
	r        *running
	c        pb.SandboxServiceClient
}

func setupBuild(t *testing.T) *buildEnv {
	t.Helper()
	e := setup(t)
	if os.Getenv("CORRAL_TEST_LOG") != "" {
		e.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	stateDir := t.TempDir()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: stateDir, Logger: e.logger})
	e.wrap = func(driver.Driver) driver.Driver { return d }
	e.egress = agent.EgressConfig{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	r := e.start()
	return &buildEnv{env: e, d: d, stateDir: stateDir, r: r, c: e.sandboxClient()}
}

// noBuildLeft fails the test if a build sandbox, its snapshot or its host
// directory is left.
func (b *buildEnv) noBuildLeft(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	cs, err := b.d.Client().Containers(ctx, `labels."corral.build"`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if labels, _ := c.Labels(ctx); labels["corral.state-dir"] == b.stateDir {
			t.Errorf("build container %s left", c.ID())
		}
	}
	err = b.d.Client().SnapshotService(containerd.DefaultSnapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if strings.HasPrefix(info.Name, driver.BuildIDPrefix) {
			// Other tests' builds may run beside this one: only ours count,
			// and ours have a host directory while they run.
			if _, err := os.Stat(filepath.Join(b.stateDir, info.Name)); err == nil {
				t.Errorf("build snapshot %s left", info.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(b.stateDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), driver.BuildIDPrefix) {
			t.Errorf("build host directory %s left", e.Name())
		}
	}
}

// TestBuildImageFromMirrors: a build of apt and pip packages from the
// test's mirrors, through the build sandbox's egress proxy, streams its
// log and makes an image whose sessions run both packages as the sandbox
// user; building it again is cached; the egress records carry the
// build's audit id. Then the image moves: exported, deleted, imported
// again, it still runs; an archive under another name, or whose size is
// a lie, is refused.
func TestBuildImageFromMirrors(t *testing.T) {
	b := setupBuild(t)
	m := mirrortest.Serve(t)
	ref := newRef(t, b.d)
	req := buildRequest(ref, m, "corral-hello")
	start := time.Now()
	lines, res, err := runBuild(t, b.c, req)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, strings.Join(lines, "\n"))
	}
	t.Logf("built %s in %s: layer %d bytes, digest %s, %d log lines", ref, took.Round(time.Millisecond), res.LayerBytes, res.Digest, len(lines))
	if res.Image != ref || !strings.HasPrefix(res.Digest, "sha256:") || res.LayerBytes <= 0 || res.Cached {
		t.Errorf("result: %+v", res)
	}
	log := strings.Join(lines, "\n")
	for _, want := range []string{"corral: step apt:", "corral: step pip:", "Setting up corral-hello (1.0)", "Successfully installed corralpkg-1.0"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
	b.noBuildLeft(t)

	ctx := t.Context()
	if _, err := b.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: ref}); err != nil {
		t.Fatal(err)
	}
	runs := func(key string) {
		t.Helper()
		out, r, err := execStream(t, b.c, key, "corral-hello")
		if err != nil || r.ExitCode != 0 || strings.TrimSpace(out) != helloOutput {
			t.Errorf("corral-hello in %s: %q %v %+v", key, out, err, r)
		}
		out, r, err = execStream(t, b.c, key, "sh", "-c", `id -u; python3 -c 'import corralpkg; print(corralpkg.VALUE)'`)
		if err != nil || r.ExitCode != 0 || strings.TrimSpace(out) != "1000\n"+pipValue {
			t.Errorf("corralpkg in %s: %q %v %+v", key, out, err, r)
		}
	}
	runs("s1")

	// Built once: the same ref again is the image as it is.
	_, again, err := runBuild(t, b.c, req)
	if err != nil || !again.Cached || again.Digest != res.Digest || again.LayerBytes != res.LayerBytes {
		t.Errorf("second build: %+v %v", again, err)
	}

	// The build's connections are on the egress trail, under its audit id.
	var recs []*pb.EgressRecord
	for i := 0; ; i++ {
		recs = recs[:0]
		for _, r := range b.ctl.Hosts()[hostID].Egress {
			if r.SessionId == req.AuditId {
				recs = append(recs, r)
			}
		}
		if len(recs) >= 2 || i == 50 {
			break
		}
		b.heartbeat(b.r)
	}
	if len(recs) < 2 {
		t.Fatalf("egress records of the build: %v", recs)
	}
	for _, r := range recs {
		if !r.Allowed || r.Host != "localhost" || r.Tenant != "ten_1" {
			t.Errorf("egress record: %v", r)
		}
	}

	// Export, delete, import: the image runs as before.
	archive := exportImage(t, b.c, ref)
	t.Logf("exported %s: %d bytes", ref, len(archive))
	if err := b.d.Client().ImageService().Delete(ctx, ref, images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.d.Image(ctx, ref); !errdefs.IsNotFound(err) {
		t.Fatalf("after the delete: %v", err)
	}
	dg, err := importImage(t, b.c, ref, int64(len(archive)), archive)
	if err != nil || dg != res.Digest {
		t.Fatalf("import: %q %v", dg, err)
	}
	if _, err := b.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s2", Image: ref}); err != nil {
		t.Fatal(err)
	}
	runs("s2")
	// Importing it while it is present succeeds.
	if _, err := importImage(t, b.c, ref, int64(len(archive)), archive); err != nil {
		t.Errorf("import of a present image: %v", err)
	}
	// An archive that holds another image than the one named.
	other := newRef(t, b.d)
	if _, err := importImage(t, b.c, other, int64(len(archive)), archive); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import under another name: %v", err)
	}
	if _, err := b.d.Image(ctx, other); !errdefs.IsNotFound(err) {
		t.Errorf("after an import under another name, %s: %v", other, err)
	}
	// Sizes that lie, both ways.
	if _, err := importImage(t, b.c, ref, int64(len(archive))+1, archive); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of a shorter archive than its size: %v", err)
	}
	if _, err := importImage(t, b.c, ref, int64(len(archive))-1, archive); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of a longer archive than its size: %v", err)
	}
	if _, err := importImage(t, b.c, ref, agent.DefaultMaxImageBytes+1, nil); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Errorf("import over the host's bound: %v", err)
	}
	// An export bound below the image's size.
	if _, err := exportImageErr(t, b.c, ref, 1<<20); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Errorf("export over max_bytes: %v", err)
	}
}

func exportImage(t *testing.T, c pb.SandboxServiceClient, image string) []byte {
	t.Helper()
	b, err := exportImageErr(t, c, image, 0)
	if err != nil {
		t.Fatalf("export %s: %v", image, err)
	}
	return b
}

func exportImageErr(t *testing.T, c pb.SandboxServiceClient, image string, max int64) ([]byte, error) {
	t.Helper()
	st, err := c.ExportImage(t.Context(), &pb.ExportImageRequest{Image: image, MaxBytes: max})
	if err != nil {
		return nil, errgrpc.FromStatus(err)
	}
	var buf bytes.Buffer
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), nil
		}
		if err != nil {
			return nil, errgrpc.FromStatus(err)
		}
		if len(m.Data) > 1<<20 {
			t.Fatalf("an export chunk of %d bytes", len(m.Data))
		}
		buf.Write(m.Data)
	}
}

// importImage sends data as an archive of size bytes named image.
func importImage(t *testing.T, c pb.SandboxServiceClient, image string, size int64, data []byte) (string, error) {
	t.Helper()
	st, err := c.ImportImage(t.Context())
	if err != nil {
		return "", errgrpc.FromStatus(err)
	}
	if err := st.Send(&pb.ImportImageRequest{Image: image, Size: size}); err != nil {
		return "", errgrpc.FromStatus(err)
	}
	for len(data) > 0 {
		n := min(len(data), 1<<20)
		if err := st.Send(&pb.ImportImageRequest{Data: data[:n]}); err != nil {
			break // the host has answered: CloseAndRecv says how
		}
		data = data[n:]
	}
	res, err := st.CloseAndRecv()
	if err != nil {
		return "", errgrpc.FromStatus(err)
	}
	return res.Digest, nil
}

// TestBuildImageFailures: a step that fails (an apt package the mirror
// lacks) fails the build as FailedPrecondition naming it and quoting its
// output, with no image and no build sandbox left; a step that reaches a
// host not allowed is refused by the proxy; a build past its timeout is
// DeadlineExceeded.
func TestBuildImageFailures(t *testing.T) {
	b := setupBuild(t)
	m := mirrortest.Serve(t)
	ctx := t.Context()

	ref := newRef(t, b.d)
	_, _, err := runBuild(t, b.c, buildRequest(ref, m, "corral-missing"))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "step apt failed (exit 100)") || !strings.Contains(err.Error(), "corral-missing") {
		t.Errorf("a missing package: %v", err)
	}
	if _, err := b.d.Image(ctx, ref); !errdefs.IsNotFound(err) {
		t.Errorf("image after a failed build: %v", err)
	}
	b.noBuildLeft(t)

	ref = newRef(t, b.d)
	req := &pb.BuildImageRequest{Ref: ref, BaseImage: debianImage, AllowedHosts: []string{"localhost"},
		Steps: []*pb.BuildStep{{Name: "fetch", Command: []string{"python3", "-c", "import urllib.request; urllib.request.urlopen('http://elsewhere.test/', timeout=15)"}}}}
	_, _, err = runBuild(t, b.c, req)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "step fetch failed") || !strings.Contains(err.Error(), "403") {
		t.Errorf("a host not allowed: %v", err)
	}

	ref = newRef(t, b.d)
	req = &pb.BuildImageRequest{Ref: ref, BaseImage: debianImage, Timeout: durationpb.New(2 * time.Second),
		Steps: []*pb.BuildStep{{Name: "slow", Command: []string{"sleep", "60"}}}}
	start := time.Now()
	_, _, err = runBuild(t, b.c, req)
	if errdefs.KindOf(err) != errdefs.DeadlineExceededKind || time.Since(start) > 30*time.Second {
		t.Errorf("a build past its timeout: %v after %s", err, time.Since(start))
	}
	if _, err := b.d.Image(ctx, ref); !errdefs.IsNotFound(err) {
		t.Errorf("image after a timed out build: %v", err)
	}
	b.noBuildLeft(t)

	// Without allowed hosts a build has no network: the mirror the other
	// builds reach is out of reach.
	ref = newRef(t, b.d)
	aptURL := strings.Replace(strings.Fields(m.APT)[1], "localhost", "127.0.0.1", 1)
	req = &pb.BuildImageRequest{Ref: ref, BaseImage: debianImage,
		Steps: []*pb.BuildStep{{Name: "offline", Command: []string{"python3", "-c", "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + 'Release', timeout=10)", aptURL}}}}
	if _, _, err = runBuild(t, b.c, req); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "step offline failed") {
		t.Errorf("a build without allowed hosts reaching a mirror: %v", err)
	}

	// Writes past the disk bound.
	ref = newRef(t, b.d)
	req = &pb.BuildImageRequest{Ref: ref, BaseImage: debianImage, Limits: &pb.Limits{DiskBytes: 8 << 20},
		Steps: []*pb.BuildStep{{Name: "fill", Command: []string{"dd", "if=/dev/zero", "of=/big", "bs=1M", "count=32"}}}}
	if _, _, err = runBuild(t, b.c, req); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind || !strings.Contains(err.Error(), "disk bound") {
		t.Errorf("a build past its disk bound: %v", err)
	}
	b.noBuildLeft(t)

	// One build at a time: another is refused while one runs; the one
	// whose caller goes away is removed.
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := b.c.BuildImage(bctx, &pb.BuildImageRequest{Ref: newRef(t, b.d), BaseImage: debianImage,
		Steps: []*pb.BuildStep{{Name: "wait", Command: []string{"sh", "-c", "echo started; sleep 60"}}}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("the first build: %v", errgrpc.FromStatus(err))
		}
		if m.GetLog() == "started" {
			break
		}
	}
	if _, _, err := runBuild(t, b.c, buildRequest(newRef(t, b.d), m, "corral-hello")); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Errorf("a second build beside the first: %v", err)
	}
	// A build sandbox is never one of the host's sandboxes.
	if hb := b.heartbeat(b.r); len(hb.Sandboxes) != 0 {
		t.Errorf("a heartbeat during a build reports sandboxes: %v", hb.Sandboxes)
	}
	cancel()
	waitfor.Cond(t, time.Minute, "the cancelled build's sandbox to go", func() bool {
		entries, _ := os.ReadDir(b.stateDir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), driver.BuildIDPrefix) {
				return false
			}
		}
		return true
	})
	b.noBuildLeft(t)
}

// TestBuildLeftoversRemovedAtStart: what a build left when its host agent
// died (its marker directory in the driver's state, its egress network,
// both keyed by the build sandbox's id) is removed when the next agent
// starts.
func TestBuildLeftoversRemovedAtStart(t *testing.T) {
	e := setup(t)
	stateDir := t.TempDir()
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, StateDir: stateDir})
	e.wrap = func(driver.Driver) driver.Driver { return d }
	id := driver.BuildIDPrefix + "0123456789abcdef"
	if err := os.Mkdir(filepath.Join(stateDir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	allow, err := egress.ParseAllowlist([]string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := egress.Setup(t.Context(), id, egress.Config{Allow: allow, Audit: egress.NewAudit(0)})
	if err != nil {
		t.Fatal(err)
	}
	n.Proxy().Close() // the proxy went with the agent; the namespaces did not
	t.Cleanup(func() { _ = egress.Remove(context.Background(), id) })
	e.start()
	if _, err := os.Stat(filepath.Join(stateDir, id)); !os.IsNotExist(err) {
		t.Errorf("the build's directory after the start: %v", err)
	}
	for _, p := range func() []string { s, p := egress.Namespaces(id); return []string{s, p} }() {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the build's namespace %s after the start: %v", p, err)
		}
	}
}
