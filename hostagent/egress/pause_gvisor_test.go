package egress_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/errdefs"
)

// A pausable gVisor sandbox in an egress network is not paused: runsc's
// restore loses its network (seen here: "network is unreachable" after a
// resume in the same namespace), so Pause refuses it with failed
// precondition and the sandbox keeps running, its way out intact.
func TestEgressSandboxIsNotPaused(t *testing.T) {
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor, Pausable: true})
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "up") }))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	allow, _ := egress.ParseAllowlist([]string{"allowed.test"})
	ctx := context.Background()
	key := fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
	network, err := egress.Setup(ctx, key, egress.Config{
		Tenant: "ten_p", Session: "sesn_p", Allow: allow, Audit: egress.NewAudit(0),
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:   egress.HostsResolver{"allowed.test": {upAddr.Addr()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer network.Close(context.Background())
	ref, err := d.Create(ctx, driver.Spec{Key: key, Image: "localhost/corral/debian:bookworm-2", Env: network.Env(), NetworkNamespace: network.Namespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Destroy(context.Background(), ref)
	fetch := func(when string) {
		t.Helper()
		sb, err := d.Attach(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"python3", "-c", fetchScript, fmt.Sprintf("https://allowed.test:%d/", upAddr.Port())}, Timeout: time.Minute})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "OK up" {
			t.Fatalf("%s: %v %q %q", when, err, res.Stdout, res.Stderr)
		}
	}
	fetch("before the pause")
	if err := d.Pause(ctx, ref); errdefs.KindOf(err) != errdefs.FailedPreconditionKind || !strings.Contains(err.Error(), "egress") {
		t.Fatalf("Pause of an egress sandbox: %v, want failed precondition", err)
	}
	if _, err := d.ExportCheckpoint(ctx, ref, io.Discard); errdefs.KindOf(err) != errdefs.FailedPreconditionKind {
		t.Fatalf("ExportCheckpoint of an egress sandbox: %v, want failed precondition", err)
	}
	fetch("after the refused pause")
}

const fetchScript = `
import ssl, sys, urllib.request
try:
    print("OK " + urllib.request.urlopen(sys.argv[1], context=ssl._create_unverified_context(), timeout=20).read().decode())
except Exception as e:
    print("ERR " + str(e))
`
