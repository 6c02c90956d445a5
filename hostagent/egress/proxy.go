package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"corral.dev/corral/internal/textcut"
)

// Resolver looks names up for the proxy. Production uses the host's
// resolver; tests pass a HostsResolver.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// HostsResolver is a fixed map of names to addresses: a test hook, so that
// a test names its own upstream servers without a DNS server. The host
// agent has no flag that sets it; in production the resolver is the host's.
type HostsResolver map[string][]netip.Addr

// LookupNetIP implements Resolver.
func (h HostsResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := h[normalize(host)]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

// Config is one sandbox's egress policy.
type Config struct {
	// Tenant and Session identify the sandbox in the audit trail.
	Tenant, Session string
	// Allow is the sandbox's allowlist. Empty: Setup refuses (an empty
	// allowlist is no network, not a proxy that refuses everything).
	Allow Allowlist
	// AllowCIDRs are the operator's (--egress-allow-cidr) private,
	// loopback or link-local prefixes the proxy may dial after all.
	AllowCIDRs []netip.Prefix
	// MaxConns bounds the sandbox's concurrent connections (default 32).
	MaxConns int
	// MaxBytes bounds the bytes, up and down, of all its connections
	// together over the sandbox's life (default 1 GiB).
	MaxBytes int64
	// BytesPerSecond bounds its bandwidth, both directions together
	// (default 8 MiB/s).
	BytesPerSecond int
	// Resolver resolves names (nil: the host's). A test hook: see
	// HostsResolver.
	Resolver Resolver
	// CA mints the certificates the proxy presents when it carries a
	// request to a credential's host (nil: no credential is injected,
	// every CONNECT is a tunnel).
	CA *CA
	// UpstreamRoots verify the upstreams of injected connections (nil:
	// the host's system roots; the agent adds --egress-upstream-ca).
	UpstreamRoots *x509.CertPool
	// Audit receives one record per connection. Required.
	Audit *Audit
	// Logger logs what the proxy cannot tell the sandbox (nil: discard).
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultMaxConns       = 32
	DefaultMaxBytes       = 1 << 30
	DefaultBytesPerSecond = 8 << 20
)

// Timeouts and bounds of one connection.
const (
	// headerTimeout bounds the time to send the request head (or the TLS
	// ClientHello after a CONNECT).
	headerTimeout = 30 * time.Second
	// maxHeaderBytes bounds the request head.
	maxHeaderBytes = 64 << 10
	dialTimeout    = 15 * time.Second
	// idleTimeout closes a connection on which nothing moved for this long.
	idleTimeout = 10 * time.Minute
	chunk       = 32 << 10
)

func (c *Config) withDefaults() Config {
	out := *c
	if out.MaxConns <= 0 {
		out.MaxConns = DefaultMaxConns
	}
	if out.MaxBytes <= 0 {
		out.MaxBytes = DefaultMaxBytes
	}
	if out.BytesPerSecond <= 0 {
		out.BytesPerSecond = DefaultBytesPerSecond
	}
	if out.Resolver == nil {
		out.Resolver = net.DefaultResolver
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Proxy is one sandbox's egress proxy: an HTTP proxy (CONNECT for TLS,
// absolute-form requests for plain HTTP) that allows a connection only when
// every name the sandbox gives agrees with the allowlist: the CONNECT host
// and the TLS server name, or the request's URL host and its Host header.
// It resolves names itself and dials only an allowed address; the sandbox
// never supplies one.
type Proxy struct {
	cfg     Config
	l       net.Listener
	limiter *rate.Limiter
	slots   chan struct{}
	used    atomic.Int64 // bytes, up and down, so far
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// mu guards conns.
	mu    sync.Mutex
	conns map[net.Conn]bool

	// credMu guards creds (inject.go).
	credMu sync.Mutex
	creds  []Credential
}

// Serve runs a proxy for cfg on l until Close.
func Serve(l net.Listener, cfg Config) *Proxy {
	cfg = cfg.withDefaults()
	burst := max(cfg.BytesPerSecond, chunk)
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, l: l, limiter: rate.NewLimiter(rate.Limit(cfg.BytesPerSecond), burst),
		slots: make(chan struct{}, cfg.MaxConns), ctx: ctx, cancel: cancel, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() net.Addr { return p.l.Addr() }

// Close stops the proxy and cuts its connections (each still audited).
func (p *Proxy) Close() error {
	p.cancel()
	err := p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if p.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				p.cfg.Logger.Warn("egress proxy accept failed", "session_id", p.cfg.Session, "error", err)
			}
			return
		}
		if !p.track(c, true) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.track(c, false)
			p.handle(c)
		}()
	}
}

// track adds or removes a connection; it refuses to add once closed.
func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.ctx.Err() != nil {
		return false
	}
	p.conns[c] = true
	return true
}

// denial is a refused connection's reason, told to the sandbox and audited.
type denial struct{ reason string }

func (d *denial) Error() string { return d.reason }

func deny(format string, args ...any) error { return &denial{fmt.Sprintf(format, args...)} }

func (p *Proxy) handle(c net.Conn) {
	defer c.Close()
	rec := Record{Tenant: p.cfg.Tenant, Session: p.cfg.Session, Start: time.Now()}
	err := p.serve(c, &rec)
	rec.End = time.Now()
	var d *denial
	switch {
	case err == nil:
		rec.Allowed = true
	case errors.As(err, &d) && !rec.Allowed:
		rec.Reason = d.reason
	case rec.Allowed:
		// Allowed, then cut (a cap) or ended by an error: say which.
		if errors.As(err, &d) {
			rec.Reason = d.reason
		}
	default:
		rec.Reason = "malformed request"
	}
	p.cfg.Audit.add(rec)
}

// serve handles one connection and fills rec; an error of type *denial is
// a refusal.
func (p *Proxy) serve(c net.Conn, rec *Record) error {
	select {
	case p.slots <- struct{}{}:
		defer func() { <-p.slots }()
	default:
		refuse(c, "connection limit reached")
		return deny("connection limit reached (%d)", p.cfg.MaxConns)
	}
	if p.used.Load() >= p.cfg.MaxBytes {
		refuse(c, "byte limit reached")
		return deny("byte limit reached")
	}
	c.SetReadDeadline(time.Now().Add(headerTimeout))
	cr := &capReader{r: c, n: maxHeaderBytes}
	br := bufio.NewReaderSize(cr, 4096)
	head, hostHeader, err := readHead(br)
	if err != nil {
		return err
	}
	req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(bytes.NewReader(head), br)))
	if err != nil {
		return err
	}
	if req.Method == http.MethodConnect {
		return p.connect(c, cr, br, req, rec)
	}
	return p.forward(c, cr, req, hostHeader, rec)
}

// connect handles CONNECT host:port: the tunnel must open with a TLS
// ClientHello whose server name is the CONNECT host.
func (p *Proxy) connect(c net.Conn, cr *capReader, br *bufio.Reader, req *http.Request, rec *Record) error {
	host, port, err := hostPort(req.Host, 0)
	rec.Host, rec.Port = host, port
	if err != nil {
		refuse(c, err.Error())
		return err
	}
	if !p.cfg.Allow.Allows(host) {
		refuse(c, "host not allowed")
		return deny("host not allowed")
	}
	if br.Buffered() > 0 {
		return deny("data sent before the tunnel opened")
	}
	// The name is resolved before the tunnel opens, so that a refused
	// address is a 403 the client sees, not a tunnel that closes.
	addr, err := p.resolve(host, rec)
	if err != nil {
		refuse(c, err.Error())
		return err
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return err
	}
	sni, err := peekSNI(br)
	switch {
	case errors.Is(err, errNotTLS):
		return deny("only TLS is allowed inside CONNECT")
	case err != nil:
		return deny("no readable TLS ClientHello: %v", err)
	case sni == "":
		return deny("TLS ClientHello has no server name")
	case normalize(sni) != host:
		return deny("TLS server name %q does not match CONNECT host", textcut.Prefix(sni, maxHostBytes))
	}
	if creds := p.credentialsFor(host); len(creds) > 0 && p.cfg.CA != nil {
		return p.inject(c, br, cr, host, port, addr, creds, rec)
	}
	up, err := p.dialAddr(addr, port, rec)
	if err != nil {
		return err
	}
	defer up.Close()
	rec.Allowed = true
	cr.lift()
	c.SetReadDeadline(time.Time{})
	// The hello the proxy peeked goes first, through the same counters.
	return p.pipe(c, br, up, rec)
}

// forward handles one plain HTTP request (absolute-form, or origin-form
// with a Host header): its URL host and Host header must agree. One request
// per connection: the proxy sends it with Connection: close, so a client
// cannot name another host on the same connection.
func (p *Proxy) forward(c net.Conn, cr *capReader, req *http.Request, hostHeader string, rec *Record) error {
	target := req.Host
	if req.URL.IsAbs() {
		if req.URL.Scheme != "http" {
			refuse(c, "only http:// URLs are proxied as requests; use CONNECT for TLS")
			return deny("scheme %q refused", textcut.Prefix(req.URL.Scheme, 16))
		}
		target = req.URL.Host
	}
	host, port, err := hostPort(target, 80)
	rec.Host, rec.Port = host, port
	if err != nil {
		refuse(c, err.Error())
		return err
	}
	if hostHeader != "" {
		hh, hp, err := hostPort(hostHeader, 80)
		if err != nil || hh != host || hp != port {
			refuse(c, "Host header does not match the request's host")
			return deny("Host header %q does not match %s", textcut.Prefix(hostHeader, maxHostBytes), host)
		}
	}
	if !p.cfg.Allow.Allows(host) {
		refuse(c, "host not allowed")
		return deny("host not allowed")
	}
	addr, err := p.resolve(host, rec)
	if err != nil {
		refuse(c, err.Error())
		return err
	}
	up, err := p.dialAddr(addr, port, rec)
	if err != nil {
		refuse(c, err.Error())
		return err
	}
	defer up.Close()
	rec.Allowed = true
	cr.lift()
	c.SetReadDeadline(time.Time{})
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Connection", "Keep-Alive"} {
		req.Header.Del(h)
	}
	if n := substitute(req.Header, p.credentialsFor(host)); n > 0 {
		rec.Injected = true
	}
	req.Close = true
	req.URL.Scheme, req.URL.Host = "", ""
	// The request (head and body) goes up through a counting writer; then
	// the response comes down until the upstream closes.
	w := &meter{p: p, w: up, n: &rec.BytesUp}
	if err := req.Write(w); err != nil {
		return err
	}
	if w.err != nil {
		return w.err
	}
	up.SetReadDeadline(time.Now().Add(idleTimeout))
	return p.copy(c, up, &rec.BytesDown, up)
}

// resolve returns the first allowed address of host; a name with no
// allowed address (metadata, private, loopback: DNS rebinding included)
// is refused. The proxy dials that address, never one the sandbox gives.
func (p *Proxy) resolve(host string, rec *Record) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, deny("name does not resolve")
	}
	for _, a := range addrs {
		if addressAllowed(a, p.cfg.AllowCIDRs) {
			return a.Unmap(), nil
		}
	}
	rec.Address = addrs[0].Unmap().String()
	return netip.Addr{}, deny("resolves to a refused address (private, loopback, link-local or metadata)")
}

// dialAddr dials a resolved address.
func (p *Proxy) dialAddr(a netip.Addr, port int, rec *Record) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	defer cancel()
	ap := netip.AddrPortFrom(a, uint16(port))
	rec.Address = ap.String()
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		return nil, deny("upstream unreachable")
	}
	return up, nil
}

// pipe copies both ways until either side ends.
func (p *Proxy) pipe(c net.Conn, fromSandbox io.Reader, up net.Conn, rec *Record) error {
	errc := make(chan error, 2)
	go func() { errc <- p.copy(up, fromSandbox, &rec.BytesUp, c) }()
	go func() { errc <- p.copy(c, up, &rec.BytesDown, up) }()
	err := <-errc
	// One side ended: close both so the other copy ends too.
	c.Close()
	up.Close()
	if err2 := <-errc; err == nil {
		err = err2
	}
	return err
}

// copy moves bytes from src to dst through the sandbox's caps, counting
// them into *n (read after the copy ends). deadline is the connection whose
// read deadline is pushed on at every read (the idle timeout).
func (p *Proxy) copy(dst io.Writer, src io.Reader, n *int64, deadline net.Conn) error {
	m := &meter{p: p, w: dst, n: n}
	buf := make([]byte, chunk)
	for {
		deadline.SetReadDeadline(time.Now().Add(idleTimeout))
		k, err := src.Read(buf)
		if k > 0 {
			// A peer that stops reading holds the copy no longer than
			// the idle timeout.
			if c, ok := dst.(net.Conn); ok {
				c.SetWriteDeadline(time.Now().Add(idleTimeout))
			}
			if _, werr := m.Write(buf[:k]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// meter writes through the sandbox's bandwidth and byte caps.
type meter struct {
	p   *Proxy
	w   io.Writer
	n   *int64
	err error
}

func (m *meter) Write(b []byte) (int, error) {
	done := 0
	for len(b) > 0 {
		k := min(len(b), chunk)
		if m.p.used.Add(int64(k)) > m.p.cfg.MaxBytes {
			m.err = deny("byte limit reached (%d bytes)", m.p.cfg.MaxBytes)
			return done, m.err
		}
		if err := m.p.limiter.WaitN(m.p.ctx, k); err != nil {
			m.err = err
			return done, err
		}
		w, err := m.w.Write(b[:k])
		done += w
		atomic.AddInt64(m.n, int64(w))
		if err != nil {
			m.err = err
			return done, err
		}
		b = b[k:]
	}
	return done, nil
}

// readHead reads the request head (up to the blank line) and returns it
// with its Host header (net/http drops that for absolute-form requests).
func readHead(br *bufio.Reader) ([]byte, string, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, "", deny("request line too long")
		}
		if err != nil {
			return nil, "", err
		}
		head = append(head, line...)
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			break
		}
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return nil, "", err
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return nil, "", err
	}
	if len(h["Host"]) > 1 {
		return nil, "", deny("more than one Host header")
	}
	return head, h.Get("Host"), nil
}

// hostPort splits host[:port] into a normalized name and a port (def when
// absent; 0 means the port is required).
func hostPort(s string, def int) (string, int, error) {
	host, portS, err := net.SplitHostPort(s)
	if err != nil {
		if def == 0 || strings.Contains(s, ":") {
			return textcut.Prefix(s, maxHostBytes), 0, deny("destination is not host:port")
		}
		host, portS = s, strconv.Itoa(def)
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 1 || port > 65535 {
		return textcut.Prefix(host, maxHostBytes), 0, deny("bad port")
	}
	host = normalize(host)
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return host, port, deny("IP addresses are refused; name an allowed host")
	}
	if !validName(host) {
		return textcut.Prefix(host, maxHostBytes), port, deny("not a host name")
	}
	return host, port, nil
}

// refuse answers a request the proxy will not carry.
func refuse(c net.Conn, why string) {
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\negress denied: %s\n", len("egress denied: ")+len(why)+1, why)
}

// capReader reads at most n bytes until lifted: the head of a request is
// bounded, what follows it in an allowed connection is the caps' business.
type capReader struct {
	r      io.Reader
	n      int64
	lifted atomic.Bool
}

func (c *capReader) lift() { c.lifted.Store(true) }

func (c *capReader) Read(b []byte) (int, error) {
	if c.lifted.Load() {
		return c.r.Read(b)
	}
	if c.n <= 0 {
		return 0, deny("request head too large")
	}
	if int64(len(b)) > c.n {
		b = b[:c.n]
	}
	k, err := c.r.Read(b)
	c.n -= int64(k)
	return k, err
}
