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

// probe runs inside the sandbox: HTTPS through the proxy to an allowed
// and a denied name, plain HTTP to the metadata address through it, and
// direct connections that bypass it.
const probe = `
import socket, ssl, sys, urllib.request
port = sys.argv[1]
ctx = ssl._create_unverified_context()
def get(url):
    try:
        r = urllib.request.urlopen(url, context=ctx, timeout=30)
        return "OK " + r.read().decode()
    except Exception as e:
        return "ERR " + str(e)
def direct(host, port):
    try:
        socket.create_connection((host, port), timeout=10).close()
        return "CONNECTED"
    except Exception as e:
        return "ERR " + str(e)
print("allowed:", get("https://allowed.test:%s/" % port))
print("denied:", get("https://other.test:%s/" % port))
print("metadata:", get("http://169.254.169.254/latest/meta-data/"))
print("rebound:", get("https://inside.test/"))
print("direct-metadata:", direct("169.254.169.254", 80))
print("direct-upstream:", direct("127.0.0.1", int(port)))
print("direct-proxy-host:", direct("10.87.0.1", 22))
`

// TestEgressFromGVisor runs a real gVisor sandbox in an egress network
// whose allowlist is allowed.test and inside.test (which resolves to the
// metadata address): allowed.test answers through the proxy, every other
// way out fails, and the audit queue holds each proxied
// attempt with its verdict. The upstream is a TLS server on the host's
// loopback, named through the proxy's HostsResolver (the test hook) and
// reachable because loopback is listed as an operator's allowed CIDR.
func TestEgressFromGVisor(t *testing.T) {
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))
	defer up.Close()
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())

	allow, err := egress.ParseAllowlist([]string{"allowed.test", "inside.test"})
	if err != nil {
		t.Fatal(err)
	}
	audit := egress.NewAudit(0)
	ctx := context.Background()
	key := fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
	network, err := egress.Setup(ctx, key, egress.Config{
		Tenant: "ten_egress", Session: "sesn_egress", Allow: allow, Audit: audit,
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver: egress.HostsResolver{
			"allowed.test": {upAddr.Addr()},
			"other.test":   {upAddr.Addr()},
			// Allowed by name, but it resolves to the metadata address.
			"inside.test": {netip.MustParseAddr("169.254.169.254")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := network.Close(context.Background()); err != nil {
			t.Errorf("closing the network: %v", err)
		}
	}()

	ref, err := d.Create(ctx, driver.Spec{Key: key, Image: "localhost/corral/debian:bookworm-2", Env: network.Env(), NetworkNamespace: network.Namespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Destroy(context.Background(), ref); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	}()
	sb, err := d.Attach(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := sb.Exec(ctx, driver.ExecRequest{Command: []string{"python3", "-c", probe, fmt.Sprint(upAddr.Port())}, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe took %v:\n%s%s", time.Since(start), res.Stdout, res.Stderr)
	out := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(res.Stdout)), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		out[k] = v
	}
	if v := out["allowed"]; v != "OK hello from allowed.test:"+fmt.Sprint(upAddr.Port()) {
		t.Errorf("allowed host: %q", v)
	}
	for _, k := range []string{"denied", "metadata", "rebound"} {
		if v := out[k]; !strings.HasPrefix(v, "ERR") || !strings.Contains(v, "403") {
			t.Errorf("%s: %q, want a 403 from the proxy", k, v)
		}
	}
	for _, k := range []string{"direct-metadata", "direct-upstream", "direct-proxy-host"} {
		if v := out[k]; !strings.HasPrefix(v, "ERR") {
			t.Errorf("%s: %q, want the connection to fail", k, v)
		}
	}

	// Three proxied attempts, each audited with its verdict; the direct
	// ones never reached anything that could carry them.
	want := map[string]string{"allowed.test": "", "other.test": "host not allowed", "169.254.169.254": "IP addresses are refused", "inside.test": "refused address"}
	got := map[string]egress.Record{}
	deadline := time.After(30 * time.Second)
	for len(got) < len(want) {
		recs, _ := audit.Drain(0)
		for _, r := range recs {
			got[r.Host] = r
		}
		if len(got) >= len(want) {
			break
		}
		select {
		case <-audit.Added():
		case <-deadline:
			t.Fatalf("audit records after 30s: %+v", got)
		}
	}
	for host, reason := range want {
		r, ok := got[host]
		switch {
		case !ok:
			t.Errorf("no audit record for %s: %+v", host, got)
		case r.Tenant != "ten_egress" || r.Session != "sesn_egress":
			t.Errorf("%s: record names %s/%s", host, r.Tenant, r.Session)
		case reason == "" && (!r.Allowed || r.BytesUp == 0 || r.BytesDown == 0):
			t.Errorf("%s: want allowed with bytes both ways: %+v", host, r)
		case reason != "" && (r.Allowed || !strings.Contains(r.Reason, reason)):
			t.Errorf("%s: want denied (%s): %+v", host, reason, r)
		}
	}
}
