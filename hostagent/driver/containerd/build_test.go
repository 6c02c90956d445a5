package containerd

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/platforms"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
)

// testRef is a fresh image name, removed from containerd when the test
// ends (the images share the test containerd's namespace).
func testRef(t *testing.T, d *Driver) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	ref := "corral.build/test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _ = d.client.ImageService().Delete(d.ns(context.Background()), ref) })
	return ref
}

// topLayer returns the files of image ref's last layer, by path, with
// their contents.
func topLayer(t *testing.T, d *Driver, ref string) map[string]string {
	t.Helper()
	ctx := d.ns(t.Context())
	cs := d.client.ContentStore()
	img, err := d.client.ImageService().Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := images.Manifest(ctx, cs, img.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	ra, err := cs.ReaderAt(ctx, m.Layers[len(m.Layers)-1])
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	zr, err := gzip.NewReader(content.NewReader(ra))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[strings.TrimPrefix(h.Name, "./")] = string(b)
	}
}

// writeStep writes a file, another through Files, and the user's id.
var writeStep = driver.BuildStep{Name: "write", Command: []string{"sh", "-c", "echo built > /built-file && id -u > /uid && echo scratch > /tmp/scratch"},
	Files: map[string][]byte{"/etc/corral/step-file": []byte("from files")}}

// TestBuildWritesReachTheSnapshot: what a build's steps write in the root
// file system, as root, is in its image's new layer; /tmp is not.
func TestBuildWritesReachTheSnapshot(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	ref := testRef(t, d)
	var out bytes.Buffer
	built, err := d.BuildImage(t.Context(), driver.BuildSpec{Ref: ref, BaseImage: busybox, Steps: []driver.BuildStep{writeStep}, Output: &out})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out.String())
	}
	files := topLayer(t, d, ref)
	if files["built-file"] != "built\n" || files["uid"] != "0\n" || files["etc/corral/step-file"] != "from files" {
		t.Errorf("the layer's files: %v", keys(files))
	}
	if _, ok := files["tmp/scratch"]; ok {
		t.Error("/tmp is in the layer")
	}
	if img, err := d.Image(t.Context(), ref); err != nil || img != built {
		t.Errorf("image %+v %v, built %+v", img, err, built)
	}
	// A session sandbox of the image sees the files.
	sbRef, err := d.Create(t.Context(), driver.Spec{Key: "s1", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), sbRef) })
	sb, err := d.Attach(t.Context(), sbRef)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(t.Context(), driver.ExecRequest{Command: []string{"cat", "/built-file", "/etc/corral/step-file"}})
	if err != nil || string(res.Stdout) != "built\nfrom files" {
		t.Errorf("in a session of the image: %q %v", res.Stdout, err)
	}
}

// TestBuildNeedsOverlayNone pins the runtime fact the build wrapper is
// for: with runsc's default, --overlay2=root:self, the root file system's
// writes stay inside the sandbox and the snapshot (so the layer) misses
// them.
func TestBuildNeedsOverlayNone(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeGVisor})
	script := fmt.Appendf(nil, "#!/bin/sh\nexec %s \"$@\"\n", shellQuote(d.cfg.RunscPath))
	wrapper, err := d.buildWrapperPath()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrapper, script, 0o755); err != nil {
		t.Fatal(err)
	}
	ref := testRef(t, d)
	if _, err := d.BuildImage(t.Context(), driver.BuildSpec{Ref: ref, BaseImage: busybox, Steps: []driver.BuildStep{writeStep}}); err != nil {
		t.Fatal(err)
	}
	if files := topLayer(t, d, ref); files["built-file"] != "" {
		t.Errorf("runsc's default overlay wrote through to the snapshot: %v", keys(files))
	}
}

func keys(m map[string]string) []string {
	var k []string
	for p := range m {
		k = append(k, p)
	}
	return k
}

// blockingWriter closes started when a line starting with "started" is
// written, and then blocks until release is closed: a host agent that
// went away mid-build.
type blockingWriter struct {
	once             sync.Once
	started, release chan struct{}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("started")) {
		w.once.Do(func() { close(w.started) })
		<-w.release
	}
	return len(p), nil
}

// TestBuildSandboxReconciled: a build sandbox is never one of List's, and
// after a crash the next Reconcile over the state dir removes it with its
// snapshot and host directory.
func TestBuildSandboxReconciled(t *testing.T) {
	cfg := Config{Runtime: RuntimeGVisor, StateDir: t.TempDir()}
	d := newDriver(t, cfg)
	w := &blockingWriter{started: make(chan struct{}), release: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		_, err := d.BuildImage(context.Background(), driver.BuildSpec{Ref: testRef(t, d), BaseImage: busybox, Output: w,
			Steps: []driver.BuildStep{{Name: "wait", Command: []string{"sh", "-c", "echo started; sleep 600"}}}})
		errc <- err
	}()
	waitfor.Closed(t, time.Minute, "the build's step to start", w.started)
	refs, err := d.List(t.Context())
	if err != nil || len(refs) != 0 {
		t.Errorf("List during a build: %v %v", refs, err)
	}
	removed, err := newDriver(t, cfg).Reconcile(t.Context())
	if err != nil || len(removed) != 1 || !strings.HasPrefix(removed[0], driver.BuildIDPrefix) {
		t.Fatalf("Reconcile during a build: %v %v", removed, err)
	}
	close(w.release)
	if err := waitfor.Chan(t, time.Minute, "the build to end", errc); err == nil {
		t.Error("the build succeeded after its sandbox was removed")
	}
	ctx := d.ns(t.Context())
	if _, err := d.client.LoadContainer(ctx, removed[0]); !errdefs.IsNotFound(kindOf(err, "")) {
		t.Errorf("the build container after Reconcile: %v", err)
	}
	if _, err := d.client.SnapshotService(d.cfg.Snapshotter).Stat(ctx, removed[0]); err == nil {
		t.Error("the build snapshot after Reconcile")
	}
	if _, err := os.Stat(dirsFor(cfg.StateDir, removed[0]).root); err == nil {
		t.Error("the build's host directory after Reconcile")
	}
}

// TestBuildImageUnderRunc: builds are gVisor's only.
func TestBuildImageUnderRunc(t *testing.T) {
	d := newDriver(t, Config{Runtime: RuntimeRunc})
	_, err := d.BuildImage(t.Context(), driver.BuildSpec{Ref: "corral.build/x", BaseImage: busybox, Steps: []driver.BuildStep{writeStep}})
	if !errdefs.IsUnimplemented(err) {
		t.Errorf("a build under runc: %v", err)
	}
}
