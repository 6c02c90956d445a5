package agent_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver"
	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// upstreamTLS starts a TLS server with a certificate for names from a CA
// of its own, and returns the server and that CA's pool.
func upstreamTLS(t *testing.T, h http.Handler, names ...string) (*httptest.Server, *x509.CertPool) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test upstream CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafT := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafT, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(h)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}}
	s.StartTLS()
	t.Cleanup(s.Close)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return s, pool
}

// fetchAuth runs in the sandbox: an HTTPS GET through the proxy with the
// token of $TOKEN, verified against the default roots (SSL_CERT_FILE)
// when argv[2] is "verify" (a tunnel reaches the test upstream, whose CA
// the sandbox does not know); the upstream answers the SHA-256 of what it
// received.
const fetchAuth = `
import os, ssl, sys, urllib.request
ctx = ssl.create_default_context() if sys.argv[2] == "verify" else ssl._create_unverified_context()
try:
    req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["TOKEN"]})
    print("OK " + urllib.request.urlopen(req, context=ctx, timeout=15).read().decode())
except Exception as e:
    print("ERR " + str(e))
`

// TestEgressSecretsThroughTheAgent: a sandbox given a credential for
// allowed.test (SyncEgressSecrets) holds only its placeholder; a request
// it sends there carries the secret when it leaves the proxy, one to
// second.test (allowed, not the credential's) the placeholder; the
// sandbox trusts the proxy through the staged CA bundle, and the secret is
// nowhere inside it. After an agent restart the secrets are gone until the
// next sync, which brings them (and the new CA's bundle) again.
func TestEgressSecretsThroughTheAgent(t *testing.T) {
	const placeholder = "corral-placeholder-6f1c0e9a2b7d4c35"
	const secret = "sk-live-4b9e8d7c6a5f4e3d2c1b"
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	e := setup(t)
	d := containerdtest.NewDriver(t, containerd.Config{Runtime: containerd.RuntimeGVisor})
	e.wrap = func(driver.Driver) driver.Driver { return d }
	var mu sync.Mutex
	seen := map[string]string{}
	up, roots := upstreamTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := strings.Cut(r.Host, ":")
		mu.Lock()
		seen[host] = r.Header.Get("Authorization")
		mu.Unlock()
		fmt.Fprint(w, sum(r.Header.Get("Authorization")))
	}), "allowed.test", "second.test")
	upAddr := netip.MustParseAddrPort(up.Listener.Addr().String())
	e.egress = agent.EgressConfig{
		AllowCIDRs:    []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:      egress.HostsResolver{"allowed.test": {upAddr.Addr()}, "second.test": {upAddr.Addr()}},
		UpstreamRoots: roots,
	}
	r := e.start()
	ctx := t.Context()
	if _, err := e.ctl.Ensure(ctx, hostID, &pb.EnsureSandbox{Key: "s1", Image: "localhost/corral/debian:bookworm-2", Tenant: "ten_1", AllowedHosts: []string{"allowed.test", "second.test"}}); err != nil {
		t.Fatal(err)
	}
	c := e.sandboxClient()
	syncSecrets := func() string {
		t.Helper()
		resp, err := c.SyncEgressSecrets(ctx, &pb.SyncEgressSecretsRequest{Key: "s1", Secrets: []*pb.EgressSecret{{Placeholder: placeholder, Value: secret, AllowedHosts: []string{"allowed.test"}}}})
		if err != nil {
			t.Fatal(err)
		}
		return "/mnt/session/uploads/" + resp.CaBundlePath
	}
	bundle := syncSecrets()
	env := map[string]string{"TOKEN": placeholder, "SSL_CERT_FILE": bundle}
	run := func(argv ...string) string {
		t.Helper()
		st, err := c.Exec(ctx, &pb.ExecRequest{Key: "s1", Command: argv, Env: env})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("exec %v: %v (output %q)", argv, err, out.String())
			}
			if ch := m.GetOutput(); ch != nil && ch.Stream == pb.OutputStream_OUTPUT_STREAM_STDOUT {
				out.Write(ch.Data)
			}
			if m.GetResult() != nil {
				return strings.TrimSpace(out.String())
			}
		}
	}
	check := func(host, want string) {
		t.Helper()
		verify := map[bool]string{true: "verify", false: "no"}[want == secret]
		got := run("python3", "-c", fetchAuth, fmt.Sprintf("https://%s:%d/echo-headers", host, upAddr.Port()), verify)
		mu.Lock()
		saw := seen[host]
		mu.Unlock()
		if got != "OK "+sum("Bearer "+want) || saw != "Bearer "+want {
			t.Errorf("%s: the sandbox got %q and the upstream saw %q, want %q", host, got, saw, want)
		}
	}
	check("allowed.test", secret)
	check("second.test", placeholder)

	// The secret is nowhere in the sandbox: not in its environment, its
	// processes' environments, or its files.
	// (grep prints the names of files that hold it, marked.)
	if out := run("sh", "-c", "env; cat /proc/*/environ; grep -rl -- '"+secret+"' /workspace /mnt /tmp | sed 's/^/LEAK: /'"); strings.Contains(out, secret) || strings.Contains(out, "LEAK: ") {
		t.Errorf("the secret is in the sandbox:\n%s", out)
	} else if !strings.Contains(out, placeholder) {
		t.Errorf("the placeholder is not in the sandbox's environment:\n%s", out)
	}

	// A restarted agent has a new CA and no secrets: the placeholder goes
	// through untouched (a tunnel) until the next sync.
	r.stop()
	e.start()
	c = e.sandboxClient()
	check("allowed.test", placeholder)
	if got := syncSecrets(); got != bundle {
		t.Fatalf("bundle path %s, then %s", bundle, got)
	}
	check("allowed.test", secret)

	// Cleared: the placeholder again.
	if _, err := c.SyncEgressSecrets(ctx, &pb.SyncEgressSecretsRequest{Key: "s1"}); err != nil {
		t.Fatal(err)
	}
	check("allowed.test", placeholder)
	if err := e.ctl.Destroy(ctx, hostID, "s1"); err != nil {
		t.Fatal(err)
	}
}
