package egress

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	placeholder = "corral-placeholder-0123456789abcdef"
	secret      = "s3cret-value-never-in-the-sandbox"
)

// seen is what an upstream received: per host, the last request's
// Authorization header, its X-Other header, query and body.
type seen struct {
	mu   sync.Mutex
	reqs map[string][4]string
}

func (s *seen) get(host string) [4]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[host]
}

// injectSetup starts a TLS upstream (certificates for any name from a CA
// of its own) and a plain HTTP one, and a proxy allowing allowed.test,
// other.test and plain.test, with a credential for allowed.test and
// plain.test. trustUpstream adds the upstream's CA to the proxy's roots.
func injectSetup(t *testing.T, trustUpstream bool) (*Proxy, *Audit, *seen, map[string]string) {
	t.Helper()
	upCA, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	sn := &seen{reqs: map[string][4]string{}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		host, _, _ := strings.Cut(r.Host, ":")
		sn.mu.Lock()
		sn.reqs[host] = [4]string{r.Header.Get("Authorization"), r.Header.Get("X-Other"), r.URL.RawQuery, string(b)}
		sn.mu.Unlock()
		fmt.Fprintf(w, "hello from %s", r.Host)
	})
	ts := httptest.NewUnstartedServer(h)
	ts.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.leaf(hi.ServerName) }}
	// Handshakes the proxy abandons (an unverified upstream) are expected.
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	tsAddr := netip.MustParseAddrPort(ts.Listener.Addr().String())
	hsAddr := netip.MustParseAddrPort(hs.Listener.Addr().String())
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	var roots *x509.CertPool
	if trustUpstream {
		roots = x509.NewCertPool()
		roots.AddCert(upCA.Certificate())
	}
	allow, _ := ParseAllowlist([]string{"allowed.test", "other.test", "plain.test"})
	hosts, _ := ParseAllowlist([]string{"allowed.test", "plain.test"})
	audit := NewAudit(0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := Serve(l, Config{
		Tenant: "ten_1", Session: "sesn_1", Allow: allow, Audit: audit, CA: ca, UpstreamRoots: roots,
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:   HostsResolver{"allowed.test": {tsAddr.Addr()}, "other.test": {tsAddr.Addr()}, "plain.test": {hsAddr.Addr()}},
	})
	t.Cleanup(func() { p.Close() })
	if err := p.SetCredentials([]Credential{{Placeholder: placeholder, Value: secret, Hosts: hosts}}); err != nil {
		t.Fatal(err)
	}
	return p, audit, sn, map[string]string{"tls": fmt.Sprint(tsAddr.Port()), "http": fmt.Sprint(hsAddr.Port())}
}

// client is an HTTP client through p that trusts p's CA only.
func client(p *Proxy) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(p.cfg.CA.Certificate())
	proxyURL, _ := url.Parse("http://" + p.Addr().String())
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, DisableKeepAlives: true,
	}}
}

func send(t *testing.T, c *http.Client, u string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", u+"?q="+placeholder, strings.NewReader("body "+placeholder))
	req.Header.Set("Authorization", "Bearer "+placeholder)
	req.Header.Set("X-Other", placeholder+","+placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", u, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "hello from") {
		t.Fatalf("%s: %s %q", u, resp.Status, b)
	}
	return resp
}

// TestInjectHeadersOnly: toward a credential's host the placeholder is
// replaced in header values, and only there (the query and the body keep
// it); toward another allowed host it stays a placeholder, through a plain
// tunnel. The sandbox sees a certificate for the name it asked, from the
// proxy's CA, over HTTP/1.1.
func TestInjectHeadersOnly(t *testing.T) {
	p, audit, sn, ports := injectSetup(t, true)
	c := client(p)

	resp := send(t, c, "https://allowed.test:"+ports["tls"]+"/x")
	got := sn.get("allowed.test")
	if got[0] != "Bearer "+secret || got[1] != secret+","+secret {
		t.Errorf("headers at the credential's host: %q, %q", got[0], got[1])
	}
	if got[2] != "q="+placeholder || got[3] != "body "+placeholder {
		t.Errorf("query and body were changed: %q, %q", got[2], got[3])
	}
	if resp.ProtoMajor != 1 || resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Errorf("protocol %s, ALPN %q: want HTTP/1.1 only", resp.Proto, resp.TLS.NegotiatedProtocol)
	}
	leaf := resp.TLS.PeerCertificates[0]
	pool := x509.NewCertPool()
	pool.AddCert(p.cfg.CA.Certificate())
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "allowed.test", Roots: pool}); err != nil || leaf.Subject.CommonName != "allowed.test" {
		t.Errorf("leaf %v does not chain to the proxy's CA for allowed.test: %v", leaf.Subject, err)
	}
	if r := wait(t, audit, 1)[0]; !r.Allowed || !r.Injected || r.Host != "allowed.test" || r.BytesUp == 0 || r.BytesDown == 0 {
		t.Errorf("audit record %+v: want allowed, injected", r)
	}

	// Another allowed host: a tunnel, TLS end to end with the upstream
	// (the proxy's CA does not sign for it), the placeholder as sent.
	oc := client(p)
	oc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	resp = send(t, oc, "https://other.test:"+ports["tls"]+"/x")
	if got := sn.get("other.test"); got[0] != "Bearer "+placeholder || got[1] != placeholder+","+placeholder {
		t.Errorf("another host saw %q, %q: want the placeholder", got[0], got[1])
	}
	if _, err := resp.TLS.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: "other.test", Roots: pool}); err == nil {
		t.Errorf("the proxy terminated TLS to a host no credential is for")
	}
	if r := wait(t, audit, 1)[0]; !r.Allowed || r.Injected || r.Host != "other.test" {
		t.Errorf("audit record %+v: want allowed, not injected", r)
	}

	// Plain HTTP to a credential's host: the same substitution.
	send(t, c, "http://plain.test:"+ports["http"]+"/x")
	if got := sn.get("plain.test"); got[0] != "Bearer "+secret || got[3] != "body "+placeholder {
		t.Errorf("plain HTTP: %q, body %q", got[0], got[3])
	}
	if r := wait(t, audit, 1)[0]; !r.Allowed || !r.Injected {
		t.Errorf("audit record %+v", r)
	}

	// No credentials any more: the tunnel is plain again.
	if err := p.SetCredentials(nil); err != nil {
		t.Fatal(err)
	}
	send(t, oc, "https://allowed.test:"+ports["tls"]+"/x")
	if got := sn.get("allowed.test"); got[0] != "Bearer "+placeholder {
		t.Errorf("after the credentials were cleared: %q", got[0])
	}
	wait(t, audit, 1)
}

// tunnel opens a CONNECT to target and TLS inside it, trusting p's CA.
func tunnel(t *testing.T, p *Proxy, target string) *tls.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.cfg.CA.Certificate())
	host, _, _ := net.SplitHostPort(target)
	tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: pool})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// TestInjectBoundsTheHead: a request head past the bound is refused with
// 431 and never reaches the upstream, whether one long line or many.
func TestInjectBoundsTheHead(t *testing.T) {
	p, audit, sn, ports := injectSetup(t, true)
	for name, hdr := range map[string]string{
		"long line":  "X-Big: " + strings.Repeat("a", 5000) + "\r\n",
		"many lines": strings.Repeat("X-Many: "+strings.Repeat("b", 1000)+"\r\n", 70),
	} {
		t.Run(name, func(t *testing.T) {
			tc := tunnel(t, p, "allowed.test:"+ports["tls"])
			go fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer %s\r\n%s\r\n", placeholder, hdr)
			resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Fatalf("oversized head: %v %v", resp, err)
			}
			if r := wait(t, audit, 1)[0]; !strings.Contains(r.Reason, "too l") || r.Injected {
				t.Fatalf("audit record %+v", r)
			}
			if got := sn.get("allowed.test"); got[0] != "" {
				t.Fatalf("the upstream got the request: %q", got)
			}
		})
	}
	// A Host header naming another host than the tunnel's is refused.
	tc := tunnel(t, p, "allowed.test:"+ports["tls"])
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer %s\r\n\r\n", placeholder)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("mismatched Host: %v %v", resp, err)
	}
	wait(t, audit, 1)
}

// TestInjectVerifiesTheUpstream: an upstream whose certificate does not
// chain to the proxy's roots gets no request (502), so the secret never
// goes to an impostor.
func TestInjectVerifiesTheUpstream(t *testing.T) {
	p, audit, sn, ports := injectSetup(t, false)
	tc := tunnel(t, p, "allowed.test:"+ports["tls"])
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer %s\r\n\r\n", placeholder)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("unverified upstream: %v %v", resp, err)
	}
	if r := wait(t, audit, 1)[0]; !strings.Contains(r.Reason, "upstream TLS") || r.Injected {
		t.Fatalf("audit record %+v", r)
	}
	if got := sn.get("allowed.test"); got[0] != "" {
		t.Fatalf("the upstream got the request: %q", got)
	}
}

func TestCALeaf(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := ca.key.Public().(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Fatalf("CA key %T, want ECDSA P-256", ca.key.Public())
	}
	a, err := ca.leaf("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	if _, err := a.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.test", Roots: pool}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
	if _, err := a.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.test", Roots: pool}); err == nil {
		t.Fatal("leaf verifies for another name")
	}
	if b, _ := ca.leaf("api.example.test"); b != a {
		t.Fatal("a second leaf for the same name was minted, not cached")
	}
	if _, err := ca.leaf("not a name"); err == nil {
		t.Fatal("a leaf for a non-name was minted")
	}
	// A leaf close to its end is minted anew.
	ca.now = func() time.Time { return time.Now().Add(leafLifetime - leafRenew/2) }
	if b, _ := ca.leaf("api.example.test"); b == a {
		t.Fatal("a leaf near its end was served from the cache")
	}
	ca.now = time.Now
	for i := range maxLeaves + 10 {
		if _, err := ca.leaf(fmt.Sprintf("h%d.example.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ca.leaves); n != maxLeaves || ca.order.Len() != maxLeaves {
		t.Fatalf("%d leaves cached, want the bound %d", n, maxLeaves)
	}
	if !strings.Contains(string(ca.Bundle()), string(ca.CertPEM())) {
		t.Fatal("the bundle lacks the CA")
	}
}

func TestCheckCredential(t *testing.T) {
	hosts, _ := ParseAllowlist([]string{"a.test"})
	for _, c := range []Credential{
		{Placeholder: "short", Value: "v", Hosts: hosts},
		{Placeholder: placeholder, Value: "with\r\nbreak", Hosts: hosts},
		{Placeholder: placeholder, Value: "", Hosts: hosts},
		{Placeholder: placeholder, Value: "v"},
	} {
		if err := CheckCredential(c); err == nil || strings.Contains(err.Error(), "break") {
			t.Errorf("%q accepted, or its error holds the value: %v", c.Placeholder, err)
		}
	}
}
