package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/textcut"
)

// Credential is a secret the proxy writes into the sandbox's requests to
// its hosts: wherever a request header value toward one of Hosts holds
// Placeholder, the proxy sends Value instead. The sandbox only ever holds
// the placeholder; Value lives in the host agent's memory (SetCredentials)
// and nowhere else on the host.
type Credential struct {
	Placeholder string
	Value       logging.Secret
	// Hosts are the names the secret is sent to (a request to any other
	// host carries the placeholder as it is).
	Hosts Allowlist
}

// Bounds of a sandbox's credentials.
const (
	MaxCredentials      = 64
	MinPlaceholderBytes = 16
	MaxPlaceholderBytes = 128
	MaxSecretBytes      = 8 << 10
)

// CheckCredential refuses a credential the proxy cannot substitute
// safely: a short placeholder (it must not occur by chance), and a
// placeholder or value that is not visible ASCII (a header value must not
// gain a line break). Its messages never hold the value.
func CheckCredential(c Credential) error {
	if len(c.Placeholder) < MinPlaceholderBytes || len(c.Placeholder) > MaxPlaceholderBytes || !visible(c.Placeholder) {
		return fmt.Errorf("a placeholder is %d to %d visible ASCII characters", MinPlaceholderBytes, MaxPlaceholderBytes)
	}
	if v := c.Value.Reveal(); len(v) == 0 || len(v) > MaxSecretBytes || !visible(v) {
		return fmt.Errorf("a secret is 1 to %d visible ASCII characters", MaxSecretBytes)
	}
	if c.Hosts.Empty() {
		return errors.New("a credential names the hosts it is sent to")
	}
	return nil
}

func visible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// SetCredentials replaces the proxy's credentials (none: nil). A
// connection already open keeps the ones it started with.
func (p *Proxy) SetCredentials(creds []Credential) error {
	if len(creds) > MaxCredentials {
		return fmt.Errorf("at most %d credentials per sandbox", MaxCredentials)
	}
	for i, c := range creds {
		if err := CheckCredential(c); err != nil {
			return fmt.Errorf("credential %d: %w", i, err)
		}
	}
	p.credMu.Lock()
	p.creds = append([]Credential(nil), creds...)
	p.credMu.Unlock()
	return nil
}

// credentialsFor returns the credentials for host.
func (p *Proxy) credentialsFor(host string) []Credential {
	p.credMu.Lock()
	defer p.credMu.Unlock()
	var out []Credential
	for _, c := range p.creds {
		if c.Hosts.Allows(host) {
			out = append(out, c)
		}
	}
	return out
}

// substitute replaces the credentials' placeholders in h's values (never
// in its names) and reports how many values changed.
func substitute(h http.Header, creds []Credential) int {
	n := 0
	for _, vs := range h {
		for i, v := range vs {
			w := v
			for _, c := range creds {
				w = strings.ReplaceAll(w, c.Placeholder, c.Value.Reveal())
			}
			if w != v {
				vs[i] = w
				n++
			}
		}
	}
	return n
}

// hopHeaders are not passed on: the proxy speaks one request per
// connection and no upgrades.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Upgrade", "Expect"}

// inject carries a CONNECT to a host some credential is for: it answers
// the sandbox's TLS itself, with a leaf for host from the host agent's CA,
// opens its own TLS to the upstream (verified against UpstreamRoots), and
// carries one HTTP/1.1 request, its header values substituted, and its
// response, then closes both sides (the response says Connection: close;
// the client opens a new tunnel for its next request, so that every
// request's head is read and bounded by the proxy). Bodies pass
// untouched.
func (p *Proxy) inject(c net.Conn, br *bufio.Reader, cr *capReader, host string, port int, addr netip.Addr, creds []Credential, rec *Record) error {
	up, err := p.dialAddr(addr, port, rec)
	if err != nil {
		return err
	}
	defer up.Close()
	rec.Allowed = true
	cr.lift()
	c.SetReadDeadline(time.Time{})
	// Until the request's head is read, the handshakes and the head
	// together get headerTimeout; then each read and write idleTimeout.
	timer := time.AfterFunc(headerTimeout, func() { c.Close(); up.Close() })
	defer timer.Stop()

	tc := tls.Server(&idleConn{Conn: c, r: br}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if normalize(hello.ServerName) != host {
				return nil, errors.New("server name changed")
			}
			return p.cfg.CA.leaf(host)
		},
	})
	defer tc.Close()
	if err := tc.HandshakeContext(p.ctx); err != nil {
		return deny("TLS with the sandbox failed: %v", textcut.Prefix(err.Error(), 120))
	}
	hcr := &capReader{r: tc, n: maxHeaderBytes}
	hbr := bufio.NewReaderSize(hcr, 4096)
	head, _, err := readHead(hbr)
	if err != nil {
		var d *denial
		if errors.As(err, &d) {
			answer(tc, http.StatusRequestHeaderFieldsTooLarge, d.reason)
			return err
		}
		return deny("malformed request inside TLS")
	}
	req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(bytes.NewReader(head), hbr)))
	if err != nil {
		answer(tc, http.StatusBadRequest, "malformed request")
		return deny("malformed request inside TLS")
	}
	if hh, hp, err := hostPort(req.Host, port); err != nil || hh != host || hp != port {
		answer(tc, http.StatusForbidden, "Host header does not match the TLS server name")
		return deny("Host header %q does not match %s", textcut.Prefix(req.Host, maxHostBytes), host)
	}
	hcr.lift()
	expect := strings.EqualFold(req.Header.Get("Expect"), "100-continue")
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.Close = true
	req.URL.Scheme, req.URL.Host = "", ""

	utc := tls.Client(&idleConn{Conn: up}, &tls.Config{
		ServerName: host, RootCAs: p.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
	})
	defer utc.Close()
	if err := utc.HandshakeContext(p.ctx); err != nil {
		answer(tc, http.StatusBadGateway, "the upstream's TLS certificate did not verify")
		p.cfg.Logger.Info("egress upstream TLS failed", "session_id", p.cfg.Session, "host", host, "err", err)
		return deny("upstream TLS failed")
	}
	timer.Stop()
	if n := substitute(req.Header, creds); n > 0 {
		rec.Injected = true
	}
	if expect {
		// The client waits for this before its body; the upstream was
		// not asked (Expect is dropped), so the proxy answers it.
		io.WriteString(tc, "HTTP/1.1 100 Continue\r\n\r\n")
	}
	w := &meter{p: p, w: utc, n: &rec.BytesUp}
	if err := req.Write(w); err != nil {
		return err
	}
	ubr := bufio.NewReader(utc)
	down := &meter{p: p, w: tc, n: &rec.BytesDown}
	for {
		resp, err := http.ReadResponse(ubr, req)
		if err != nil {
			answer(tc, http.StatusBadGateway, "the upstream's response was not readable")
			return deny("upstream response malformed")
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return deny("upstream switched protocols")
		}
		if resp.StatusCode < 200 { // informational: its final response follows
			if err := resp.Write(down); err != nil {
				return err
			}
			continue
		}
		resp.Close = true
		resp.Header.Del("Connection")
		resp.Header.Del("Keep-Alive")
		err = resp.Write(down)
		resp.Body.Close()
		return err
	}
}

// answer writes a short response inside an injected connection.
func answer(w io.Writer, code int, why string) {
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\negress denied: %s\n",
		code, http.StatusText(code), len("egress denied: ")+len(why)+1, why)
}

// idleConn is a connection whose every read and write must make progress
// within idleTimeout; reads come from r first when set (the bytes the
// proxy peeked).
type idleConn struct {
	net.Conn
	r io.Reader
}

func (c *idleConn) Read(b []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(idleTimeout))
	if c.r != nil {
		return c.r.Read(b)
	}
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(idleTimeout))
	return c.Conn.Write(b)
}
