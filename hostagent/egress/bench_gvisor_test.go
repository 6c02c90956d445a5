package egress_test

import (
	"context"
	"fmt"
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
)

// measure runs in the sandbox: 20 HTTPS requests through the proxy, each
// on a new connection, then one 64 MiB download; it prints the median
// request time and the download's rate.
const measure = `
import ssl, sys, time, urllib.request
port = sys.argv[1]
ctx = ssl._create_unverified_context()
times = []
for i in range(20):
    t = time.monotonic()
    urllib.request.urlopen("https://allowed.test:%s/small" % port, context=ctx, timeout=30).read()
    times.append(time.monotonic() - t)
times.sort()
t = time.monotonic()
n = len(urllib.request.urlopen("https://allowed.test:%s/big" % port, context=ctx, timeout=120).read())
d = time.monotonic() - t
print("median_request_ms %.1f" % (times[10] * 1000))
print("download_mib_per_s %.1f bytes %d" % (n / d / (1 << 20), n))
`

// TestEgressFigures measures what the egress path costs a gVisor sandbox:
// a request on a new connection through the proxy, and a large download,
// with the bandwidth cap out of the way. It logs the figures; it asserts
// only that they completed.
func TestEgressFigures(t *testing.T) {
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	big := strings.Repeat("x", 64<<20)
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			fmt.Fprint(w, big)
			return
		}
		fmt.Fprint(w, "small")
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	allow, _ := egress.ParseAllowlist([]string{"allowed.test"})
	audit := egress.NewAudit(0)
	ctx := context.Background()
	key := fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
	network, err := egress.Setup(ctx, key, egress.Config{
		Tenant: "ten_f", Session: "sesn_f", Allow: allow, Audit: audit,
		AllowCIDRs:     []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		BytesPerSecond: 1 << 30,
		Resolver:       egress.HostsResolver{"allowed.test": {upAddr.Addr()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer network.Close(context.Background())
	ref, err := d.Create(ctx, driver.Spec{Key: key, Image: "localhost/corral/debian:bookworm-2", Env: network.Env(), NetworkNamespace: network.Namespace(),
		Limits: driver.Limits{MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Destroy(context.Background(), ref)
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"python3", "-c", measure, fmt.Sprint(upAddr.Port())}, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "bytes 67108864") {
		t.Fatalf("measure: %+v\n%s%s", res, res.Stdout, res.Stderr)
	}
	t.Logf("through the egress proxy from gVisor:\n%s", res.Stdout)
}
