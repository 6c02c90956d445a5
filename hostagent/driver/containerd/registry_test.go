package containerd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
)

// startRegistry runs Debian's docker-registry (the distribution registry) on
// a free loopback port and returns its host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("docker-registry is not installed; scripts/runtime/install.sh installs it")
		}
		t.Skip("docker-registry is not installed (scripts/runtime/install.sh installs it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	conf := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfg)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("the registry's output:\n%s", out.String())
		}
	})
	waitfor.State(t, 30*time.Second, "the registry at "+addr+" to answer", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, fmt.Sprintf("status %d", resp.StatusCode)
	})
	return addr
}

func TestPullFromRegistry(t *testing.T) {
	requireRuntime(t)
	reg := startRegistry(t)
	d := newDriver(t, Config{Runtime: RuntimeGVisor, Pull: true, PlainHTTPRegistries: []string{reg}})
	ctx := d.ns(context.Background())

	// Publish the imported busybox image under the registry's name.
	img, err := d.client.GetImage(ctx, busybox)
	if err != nil {
		t.Fatal(err)
	}
	ref := fmt.Sprintf("%s/corral/busybox:pull-%d", reg, time.Now().UnixNano())
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost))})
	if err := d.client.Push(ctx, ref, img.Target(), client.WithResolver(resolver)); err != nil {
		t.Fatalf("pushing to the test registry: %v", err)
	}
	t.Cleanup(func() { _ = d.client.ImageService().Delete(context.WithoutCancel(ctx), ref) })
	if _, err := d.client.GetImage(ctx, ref); err == nil {
		t.Fatal("the image is already present; the test would not show a pull")
	}

	// A host that does not pull refuses the image it lacks, saying how to
	// fix it, and leaves nothing behind.
	nopull := newDriver(t, Config{Runtime: RuntimeGVisor})
	_, err = nopull.Create(context.Background(), driver.Spec{Key: t.Name() + "/nopull", Image: ref})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "--pull-images") {
		t.Fatalf("Create without pulling: %v, want not found naming --pull-images", err)
	}
	assertNothingLeft(t, nopull)

	// A host that pulls fetches it and runs it.
	_, sb := create(t, d, driver.Spec{Image: ref})
	if got := string(run(t, sb, "echo pulled; id -u").Stdout); got != "pulled\n1000\n" {
		t.Fatalf("sandbox from the pulled image said %q", got)
	}
	if _, err := d.client.GetImage(ctx, ref); err != nil {
		t.Fatalf("the pulled image is not recorded: %v", err)
	}

	// An image the registry lacks is a clear not-found, and nothing is left.
	_, err = d.Create(context.Background(), driver.Spec{Key: t.Name() + "/missing", Image: reg + "/corral/nope:1"})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Create of an image the registry lacks: %v (%v), want not found", err, errdefs.KindOf(err))
	}
}
