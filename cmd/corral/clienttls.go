package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"corral.dev/corral/controlplane/server"
)

// tlsCAEnv names a PEM file of the CA certificates the CLI trusts for
// servers, in place of the system's roots.
const tlsCAEnv = "CORRAL_TLS_CA"

// clientTLS is how the verbs verify the server they talk to. An address is
// host:port, https://host:port or http://host:port:
//   - https:// is TLS, verified against the system's roots or --tls-ca;
//   - http:// is plaintext, refused beyond loopback unless --insecure;
//   - a bare address is TLS beyond loopback or whenever a CA is given, and
//     plaintext on loopback otherwise (corral dev).
type clientTLS struct {
	caFile   string
	insecure bool
}

func (c *clientTLS) register(f *pflag.FlagSet) {
	f.StringVar(&c.caFile, "tls-ca", os.Getenv(tlsCAEnv), "PEM file of the CA that signed the server's certificate, instead of the system's roots (default $"+tlsCAEnv+")")
	f.BoolVar(&c.insecure, "insecure", false, "speak plaintext to the server even beyond loopback: keys cross the network in the clear")
}

// dial connects to the gRPC server at addr as c says.
func (c *clientTLS) dial(addr string, opts ...grpc.DialOption) (*serverConn, error) {
	target, creds, hs, err := c.credentials(addr)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("server address %s: %w", addr, err)
	}
	return &serverConn{ClientConn: conn, hs: hs}, nil
}

func (c *clientTLS) credentials(addr string) (target string, creds credentials.TransportCredentials, hs *handshakeErr, err error) {
	hostport, cfg, err := c.config(addr)
	if err != nil {
		return "", nil, nil, err
	}
	if cfg == nil {
		return hostport, insecure.NewCredentials(), nil, nil
	}
	hs = &handshakeErr{}
	return hostport, &explainedTLS{TransportCredentials: credentials.NewTLS(cfg), addr: hostport, caFile: c.caFile, hs: hs}, hs, nil
}

// config is how to reach addr: its host:port and the TLS configuration to
// verify it with, nil for plaintext. The gRPC and the REST verbs share it.
func (c *clientTLS) config(addr string) (hostport string, cfg *tls.Config, err error) {
	scheme, hostport, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, hostport = "", addr
	}
	hostport = strings.TrimSuffix(hostport, "/")
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", nil, fmt.Errorf("server address %q: want host:port, https://host:port or http://host:port", addr)
	}
	var useTLS bool
	switch scheme {
	case "https":
		useTLS = true
	case "http":
	case "":
		useTLS = c.caFile != "" || !server.IsLoopback(hostport)
	default:
		return "", nil, fmt.Errorf("server address %q: unknown scheme %s (https or http)", addr, scheme)
	}
	if c.insecure {
		useTLS = false
	}
	if !useTLS {
		if !c.insecure && !server.IsLoopback(hostport) {
			return "", nil, fmt.Errorf("refusing to send credentials in plaintext to %s, which is not a loopback address: use https:// (with --tls-ca FILE or $%s for a private CA), or --insecure", addr, tlsCAEnv)
		}
		return hostport, nil, nil
	}
	cfg = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return "", nil, fmt.Errorf("reading --tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return "", nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", c.caFile)
		}
	}
	return hostport, cfg, nil
}

// serverConn is a connection that can tell why its handshake failed.
type serverConn struct {
	*grpc.ClientConn
	hs *handshakeErr // nil for plaintext
}

// handshakeFailure is why the connection's last TLS handshake failed, or
// nil when it did not (or the connection is plaintext). A call that fails
// on a connection that could not be made reports this, not "unavailable".
func (s *serverConn) handshakeFailure() error {
	if s.hs == nil {
		return nil
	}
	return s.hs.get()
}

// handshakeErr keeps the error of a connection's last TLS handshake (nil
// after one that succeeded).
type handshakeErr struct {
	mu  sync.Mutex
	err error
}

func (h *handshakeErr) set(err error) { h.mu.Lock(); h.err = err; h.mu.Unlock() }
func (h *handshakeErr) get() error    { h.mu.Lock(); defer h.mu.Unlock(); return h.err }

// explainedTLS is TLS whose handshake errors say which server failed and
// what to set.
type explainedTLS struct {
	credentials.TransportCredentials
	addr, caFile string
	hs           *handshakeErr
}

func (e *explainedTLS) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := e.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil {
		err = explainTLS(e.addr, e.caFile, err)
	}
	e.hs.set(err)
	return c, info, err
}

func (e *explainedTLS) Clone() credentials.TransportCredentials {
	return &explainedTLS{TransportCredentials: e.TransportCredentials.Clone(), addr: e.addr, caFile: e.caFile, hs: e.hs}
}

// explainTLS says what a failed verification of addr's certificate means.
func explainTLS(addr, caFile string, err error) error {
	var unknown x509.UnknownAuthorityError
	var name x509.HostnameError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown) && caFile != "":
		return fmt.Errorf("verifying server %s: %w (the CA in --tls-ca %s did not sign its certificate: give the CA that did with --tls-ca FILE or $%s)", addr, err, caFile, tlsCAEnv)
	case errors.As(err, &unknown):
		return fmt.Errorf("verifying server %s: %w (the system's roots do not trust it: give its CA with --tls-ca FILE or $%s)", addr, err, tlsCAEnv)
	case errors.As(err, &name):
		return fmt.Errorf("verifying server %s: %w (dial a name or address its certificate carries)", addr, err)
	case errors.As(err, &record):
		return fmt.Errorf("server %s does not speak TLS: %w (a plaintext server on loopback: give http://%s)", addr, err, addr)
	}
	return fmt.Errorf("TLS with server %s: %w", addr, err)
}
