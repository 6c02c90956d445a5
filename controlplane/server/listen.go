package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"corral.dev/corral/controlplane/api"
	"corral.dev/corral/internal/certreload"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/metrics"
)

// The public listeners (the REST API's, the admin gRPC API's and the
// metrics listener, when there is one) serve TLS
// with the certificate of Config.TLSCertFile, or plaintext only on a
// loopback address unless Config.InsecureListen says otherwise. The Raft
// and host listeners have rules of their own.

// publicListener is one of the listeners these rules cover.
type publicListener struct {
	name string // as the flags name it
	addr string
}

func (c *Config) publicListeners() []publicListener {
	addr := func(ln net.Listener, a string) string {
		if ln != nil {
			return ln.Addr().String()
		}
		return a
	}
	ls := []publicListener{
		{"--http-addr (REST API)", addr(c.HTTPListener, c.HTTPAddr)},
		{"--grpc-addr (admin gRPC API)", addr(c.GRPCListener, c.GRPCAddr)},
	}
	if c.MetricsAddr != "" {
		ls = append(ls, publicListener{"--metrics-addr (Prometheus metrics, which name tenants)", c.MetricsAddr})
	}
	return ls
}

// validateListen refuses plaintext on a non-loopback address, unless
// InsecureListen, and half a certificate.
func (c *Config) validateListen() error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errdefs.InvalidArgument("--tls-cert and --tls-key go together: give both or neither")
	}
	if c.TLSCertFile != "" || c.InsecureListen {
		return nil
	}
	for _, l := range c.plaintextExposed() {
		return errdefs.InvalidArgument("refusing to serve %s in plaintext on %s, which is not a loopback address: give --tls-cert and --tls-key, or --insecure-listen to send API keys in the clear", l.name, l.addr)
	}
	return nil
}

// plaintextExposed lists the public listeners that would serve plaintext
// beyond loopback.
func (c *Config) plaintextExposed() []publicListener {
	if c.TLSCertFile != "" {
		return nil
	}
	var out []publicListener
	for _, l := range c.publicListeners() {
		if !IsLoopback(l.addr) {
			out = append(out, l)
		}
	}
	return out
}

// IsLoopback reports whether addr names only this machine (see
// metrics.IsLoopback, which the host agent's metrics listener shares).
func IsLoopback(addr string) bool { return metrics.IsLoopback(addr) }

// startTLS loads the serving certificate when one is configured, wraps the
// gRPC listener in TLS and gives the HTTP server its TLS config; without
// one it says loudly which listeners serve plaintext beyond loopback.
func (s *Server) startTLS() error {
	if s.cfg.TLSCertFile == "" {
		for _, l := range s.cfg.plaintextExposed() {
			s.log.Warn("INSECURE: serving in plaintext beyond loopback (--insecure-listen); API keys and operator keys cross the network in the clear: give --tls-cert and --tls-key",
				"listener", l.name, "addr", l.addr)
		}
		return nil
	}
	certs, err := certreload.New(s.cfg.TLSCertFile, s.cfg.TLSKeyFile, s.log)
	if err != nil {
		return err
	}
	s.certs = certs
	s.grpcLn = tls.NewListener(s.grpcLn, certs.ServerConfig("h2"))
	s.log.Info("serving TLS", "cert_file", s.cfg.TLSCertFile, "subject", certs.Leaf().Subject.String(), "not_after", certs.Leaf().NotAfter)
	return nil
}

// newHTTPServer is the node's HTTP server: bounded headers, deadlines for
// reading the header block and the whole request, and for idle
// connections. (A read deadline does not end a long response: event
// streams and drains go on.)
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       api.ReadTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    api.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.certs != nil {
		srv.TLSConfig = s.certs.ServerConfig()
	}
	return srv
}

// serveHTTP serves the HTTP listener, over TLS when configured.
func (s *Server) serveHTTP() error {
	if s.certs != nil {
		return s.http.ServeTLS(s.httpLn, "", "")
	}
	return s.http.Serve(s.httpLn)
}

// runCerts reloads the certificate until ctx ends (SIGHUP, file changes).
func (s *Server) runCerts(ctx context.Context) {
	if s.certs != nil {
		s.certs.Run(ctx, s.cfg.TLSReloadInterval)
	}
}

// listenGateway is the gateway's own way into the gRPC server: plaintext
// on loopback, in this process only by convention (its port is random and
// printed nowhere); it passes through every interceptor like any call.
func listenGateway() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("gateway listener: %w", err)
	}
	return ln, nil
}
