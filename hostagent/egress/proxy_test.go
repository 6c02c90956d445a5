package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// setup starts a TLS and a plain HTTP upstream on loopback, named
// allowed.test and plain.test through a HostsResolver, and a proxy for
// allowed (loopback allowed through AllowCIDRs, as an operator would list
// an internal mirror). It returns the proxy and its audit queue.
func setup(t *testing.T, allowed []string, tune func(*Config)) (*Proxy, *Audit, map[string]string) {
	t.Helper()
	body := func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) }
	ts := httptest.NewTLSServer(http.HandlerFunc(body))
	t.Cleanup(ts.Close)
	hs := httptest.NewServer(http.HandlerFunc(body))
	t.Cleanup(hs.Close)
	tsAddr := netip.MustParseAddrPort(ts.Listener.Addr().String())
	hsAddr := netip.MustParseAddrPort(hs.Listener.Addr().String())
	allow, err := ParseAllowlist(allowed)
	if err != nil {
		t.Fatal(err)
	}
	audit := NewAudit(0)
	cfg := Config{
		Tenant: "ten_1", Session: "sesn_1", Allow: allow, Audit: audit,
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver: HostsResolver{
			"allowed.test":  {tsAddr.Addr()},
			"other.test":    {tsAddr.Addr()},
			"plain.test":    {hsAddr.Addr()},
			"metadata.test": {netip.MustParseAddr("169.254.169.254")},
			"rebind.test":   {netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("10.1.2.3")},
		},
	}
	if tune != nil {
		tune(&cfg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := Serve(l, cfg)
	t.Cleanup(func() { p.Close() })
	ports := map[string]string{"tls": fmt.Sprint(tsAddr.Port()), "http": fmt.Sprint(hsAddr.Port())}
	return p, audit, ports
}

// viaConnect opens a CONNECT tunnel to target and speaks TLS with sni
// inside it; it returns the HTTP response body, or an error.
func viaConnect(t *testing.T, p *Proxy, target, sni string) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni)
	resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// wait takes n records off the audit queue, waiting on its signal.
func wait(t *testing.T, a *Audit, n int) []Record {
	t.Helper()
	var got []Record
	deadline := time.After(30 * time.Second)
	for len(got) < n {
		r, _ := a.Drain(0)
		got = append(got, r...)
		if len(got) >= n {
			break
		}
		select {
		case <-a.Added():
		case <-deadline:
			t.Fatalf("%d audit records after 30s, want %d: %+v", len(got), n, got)
		}
	}
	return got
}

func TestProxyConnect(t *testing.T) {
	p, audit, ports := setup(t, []string{"allowed.test", "plain.test"}, nil)
	tlsPort := ports["tls"]
	cases := []struct {
		name, target, sni string
		ok                bool
		reason            string
	}{
		{"allowed", "allowed.test:" + tlsPort, "allowed.test", true, ""},
		{"not listed", "other.test:" + tlsPort, "other.test", false, "host not allowed"},
		{"server name differs", "allowed.test:" + tlsPort, "other.test", false, "does not match CONNECT host"},
		{"raw IP", "127.0.0.1:" + tlsPort, "allowed.test", false, "IP addresses are refused"},
		{"metadata IP", "169.254.169.254:80", "allowed.test", false, "IP addresses are refused"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body, err := viaConnect(t, p, c.target, c.sni)
			if c.ok && (err != nil || !strings.Contains(body, "hello from")) {
				t.Fatalf("allowed connection: %q, %v", body, err)
			}
			if !c.ok && err == nil {
				t.Fatalf("denied connection answered: %q", body)
			}
			r := wait(t, audit, 1)[0]
			if r.Allowed != c.ok || !strings.Contains(r.Reason, c.reason) || r.Tenant != "ten_1" || r.Session != "sesn_1" {
				t.Fatalf("audit record %+v, want allowed=%v reason ~%q", r, c.ok, c.reason)
			}
			if c.ok && (r.BytesUp == 0 || r.BytesDown == 0 || r.Address == "" || r.Host != "allowed.test") {
				t.Fatalf("allowed record lacks its bytes, address or host: %+v", r)
			}
		})
	}
}

func TestProxyRefusesInternalAddresses(t *testing.T) {
	// metadata.test resolves to 169.254.169.254, rebind.test to loopback
	// and private addresses outside AllowCIDRs: allowed by name, refused
	// by address.
	p, audit, _ := setup(t, []string{"metadata.test", "rebind.test", "allowed.test"}, func(c *Config) { c.AllowCIDRs = nil })
	for _, target := range []string{"metadata.test:80", "rebind.test:443", "allowed.test:443"} {
		if _, err := viaConnect(t, p, target, strings.Split(target, ":")[0]); err == nil {
			t.Fatalf("%s: connected", target)
		}
		r := wait(t, audit, 1)[0]
		if r.Allowed || !strings.Contains(r.Reason, "refused address") {
			t.Fatalf("%s: audit record %+v", target, r)
		}
	}
}

func TestProxyPlainHTTP(t *testing.T) {
	p, audit, ports := setup(t, []string{"plain.test"}, nil)
	proxyURL, _ := url.Parse("http://" + p.Addr().String())
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 30 * time.Second}
	resp, err := client.Get("http://plain.test:" + ports["http"] + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "hello from plain.test") {
		t.Fatalf("allowed GET: %s %q", resp.Status, b)
	}
	if r := wait(t, audit, 1)[0]; !r.Allowed || r.Host != "plain.test" || r.BytesDown == 0 {
		t.Fatalf("audit record %+v", r)
	}

	// A Host header naming another host than the URL is refused.
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://plain.test:%s/ HTTP/1.1\r\nHost: other.test\r\n\r\n", ports["http"])
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("mismatched Host: %v %v", resp, err)
	}
	if r := wait(t, audit, 1)[0]; r.Allowed || !strings.Contains(r.Reason, "does not match") {
		t.Fatalf("audit record %+v", r)
	}
}

func TestProxyCaps(t *testing.T) {
	t.Run("connections", func(t *testing.T) {
		p, audit, _ := setup(t, []string{"allowed.test"}, func(c *Config) { c.MaxConns = 1 })
		// A connection holds the one slot while it sends no whole head; the
		// next is refused. The slot is taken when a connection's serve
		// starts, so the second can start first: then the holder was the
		// one refused (or waits), and the round starts again with both
		// connections' records drained. Bounded in rounds.
		var hold net.Conn
		for round := 1; ; round++ {
			var err error
			if hold, err = net.Dial("tcp", p.Addr().String()); err != nil {
				t.Fatal(err)
			}
			fmt.Fprint(hold, "CONNECT allowed.test:1 HTTP/1.1\r\n")
			_, err = viaConnect(t, p, "allowed.test:443", "allowed.test")
			if err != nil && strings.Contains(err.Error(), "connection limit") {
				break
			}
			hold.Close()
			wait(t, audit, 2)
			if round == 20 {
				t.Fatal("no connection was refused at the cap in 20 rounds")
			}
		}
		hold.Close()
		recs := wait(t, audit, 2)
		found := false
		for _, r := range recs {
			found = found || (!r.Allowed && strings.Contains(r.Reason, "connection limit"))
		}
		if !found {
			t.Fatalf("no connection-limit record: %+v", recs)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		p, audit, ports := setup(t, []string{"allowed.test"}, func(c *Config) { c.MaxBytes = 2000 })
		if _, err := viaConnect(t, p, "allowed.test:"+ports["tls"], "allowed.test"); err == nil {
			t.Fatal("a TLS exchange larger than the byte cap completed")
		}
		r := wait(t, audit, 1)[0]
		if !strings.Contains(r.Reason, "byte limit") || r.BytesUp+r.BytesDown > 2000 {
			t.Fatalf("audit record %+v", r)
		}
		if _, err := viaConnect(t, p, "allowed.test:"+ports["tls"], "allowed.test"); err == nil || !strings.Contains(err.Error(), "byte limit") {
			t.Fatalf("after the cap: %v", err)
		}
		wait(t, audit, 1)
	})
}

func TestAuditBounded(t *testing.T) {
	a := NewAudit(2)
	for range 5 {
		a.add(Record{Host: strings.Repeat("h", 1000), Reason: strings.Repeat("r", 1000)})
	}
	recs, dropped := a.Drain(0)
	if len(recs) != 2 || dropped != 3 || len(recs[0].Host) != maxHostBytes || len(recs[0].Reason) != maxReasonBytes {
		t.Fatalf("drain: %d records, %d dropped, host %d bytes", len(recs), dropped, len(recs[0].Host))
	}
	if recs, dropped := a.Drain(0); len(recs) != 0 || dropped != 0 {
		t.Fatalf("second drain: %d, %d", len(recs), dropped)
	}
}

// TestAuditHeldUntilAcked: Pending leaves records held (and counted
// against the capacity) until an Ack covers them; acks may come late, out
// of order or twice; the dropped count is told until acknowledged, once.
func TestAuditHeldUntilAcked(t *testing.T) {
	a := NewAudit(3)
	a.add(Record{Host: "a"})
	a.add(Record{Host: "b"})
	r1, d1, m1 := a.Pending(1)
	if len(r1) != 1 || r1[0].Host != "a" || r1[0].ID == "" || d1 != 0 {
		t.Fatalf("first pending: %+v, %d dropped", r1, d1)
	}
	r2, _, m2 := a.Pending(0)
	if len(r2) != 2 || r2[0].ID != r1[0].ID || r2[1].ID == r1[0].ID {
		t.Fatalf("second pending (nothing acked): %+v", r2)
	}
	// Held records fill the queue: the fourth and fifth are dropped.
	a.add(Record{Host: "c"})
	a.add(Record{Host: "d"})
	a.add(Record{Host: "e"})
	_, d3, m3 := a.Pending(0)
	if d3 != 2 {
		t.Fatalf("dropped %d, want 2", d3)
	}
	a.Ack(m2)
	a.Ack(m1) // late: covered by m2
	if recs, d, _ := a.Pending(0); len(recs) != 1 || recs[0].Host != "c" || d != 2 {
		t.Fatalf("after acking two: %+v, %d dropped", recs, d)
	}
	a.Ack(m3)
	a.Ack(m3)
	if recs, d, _ := a.Pending(0); len(recs) != 0 || d != 0 || a.Held() != 0 {
		t.Fatalf("after acking all: %+v, %d dropped, %d held", recs, d, a.Held())
	}
	// Ids are unique across Audits (a restarted agent's new queue).
	b := NewAudit(1)
	b.add(Record{Host: "a"})
	if rb, _, _ := b.Pending(0); rb[0].ID == r1[0].ID {
		t.Fatalf("two queues gave the same id %q", rb[0].ID)
	}
}
