package raftfsm

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
	"corral.dev/corral/internal/seal"
)

// handshakeTimeout bounds a peer's TLS handshake on the Raft port.
const handshakeTimeout = 10 * time.Second

// The node's credentials in its data directory, under node/: its
// certificate and the nodes' CA certificate (PEM), and its key sealed with
// the seal key (never in the clear). ca-key.sealed exists on a bootstrap
// node only until the nodes' CA is committed to Raft.
const (
	credsDirName   = "node"
	certFile       = "cert.pem"
	caFile         = "ca.pem"
	keyFile        = "key.sealed"
	caKeyFile      = "ca-key.sealed"
	genSealKeyFile = "seal.key" // generated seal key, when none is given
)

// creds are a node's TLS identity.
type creds struct {
	ca   *x509.Certificate
	cert tls.Certificate
	id   string
}

func credsDir(dataDir string) string { return filepath.Join(dataDir, credsDirName) }

// loadCreds reads the node's credentials from dataDir; ok is false when it
// holds none. A key sealed under a key other than the ring's current one is
// sealed again under it when reseal is set (after a seal rotation). With
// wantID set, the certificate must name that node.
func loadCreds(dataDir string, ring *seal.Keyring, wantID string, reseal bool) (_ *creds, ok bool, _ error) {
	dir := credsDir(dataDir)
	if _, err := os.Stat(filepath.Join(dir, certFile)); errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	leaf, err := hostpki.ReadCertPEM(filepath.Join(dir, certFile))
	if err != nil {
		return nil, false, fmt.Errorf("reading this node's certificate: %w", err)
	}
	ca, err := hostpki.ReadCertPEM(filepath.Join(dir, caFile))
	if err != nil {
		return nil, false, fmt.Errorf("reading the nodes' CA certificate: %w", err)
	}
	sealed, err := readSealed(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, false, err
	}
	der, err := ring.Open(SealNodeKey, sealed)
	if err != nil {
		return nil, false, fmt.Errorf("cannot unseal this node's key: %w", err)
	}
	key, err := x509.ParseECPrivateKey(der)
	clear(der)
	if err != nil {
		return nil, false, fmt.Errorf("this node's key: %w", err)
	}
	id, err := hostpki.NodeID(leaf)
	if err != nil {
		return nil, false, err
	}
	if wantID != "" && id != wantID {
		return nil, false, errdefs.FailedPrecondition("%s holds the certificate of node %q, not %q", dir, id, wantID)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: certPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, false, fmt.Errorf("this node's certificate: %w", err)
	}
	cert, err := hostpki.NodeCertificate(leaf.Raw, ca.Raw, key)
	if err != nil {
		return nil, false, err
	}
	if reseal && sealed.KeyID != ring.CurrentID() {
		if err := writeSealedKey(filepath.Join(dir, keyFile), ring, SealNodeKey, func() ([]byte, error) { return marshalKey(key) }); err != nil {
			return nil, false, fmt.Errorf("resealing this node's key: %w", err)
		}
	}
	return &creds{ca: ca, cert: cert, id: id}, true, nil
}

// marshalKey encodes a node's EC key, DER, for sealing.
func marshalKey(key any) ([]byte, error) {
	k, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("node key is a %T, want ECDSA", key)
	}
	return x509.MarshalECPrivateKey(k)
}

func certPool(ca *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca)
	return p
}

// writeCreds stores a node's certificate, the CA's and its key (sealed).
func writeCreds(dataDir string, ring *seal.Keyring, c tls.Certificate, caDER []byte) error {
	dir := credsDir(dataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeSealedKey(filepath.Join(dir, keyFile), ring, SealNodeKey, func() ([]byte, error) { return marshalKey(c.PrivateKey) }); err != nil {
		return err
	}
	if err := hostpki.WriteFileAtomic(filepath.Join(dir, caFile), hostpki.CertPEM(caDER), 0o644); err != nil {
		return err
	}
	return hostpki.WriteFileAtomic(filepath.Join(dir, certFile), hostpki.CertPEM(c.Certificate[0]), 0o644)
}

// writeSealedKey seals the key DER that marshal returns and writes the
// envelope to path, mode 0600.
func writeSealedKey(path string, ring *seal.Keyring, purpose string, marshal func() ([]byte, error)) error {
	der, err := marshal()
	if err != nil {
		return err
	}
	s, err := ring.Seal(purpose, der)
	clear(der)
	if err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return hostpki.WriteFileAtomic(path, b, 0o600)
}

func readSealed(path string) (seal.Sealed, error) {
	var s seal.Sealed
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, errdefs.InvalidArgument("%s: not a sealed key: %v", path, err)
	}
	return s, nil
}

// loadRing opens the node's seal key file: the configured one, else the
// one generated in dataDir before, else (a first start that bootstraps) a
// new one generated there.
func loadRing(cfg *Config, log interface {
	Warn(msg string, args ...any)
}) (*seal.Keyring, error) {
	switch {
	case cfg.Seal != nil:
		return cfg.Seal, nil
	case cfg.SealKeyFile != "":
		return seal.Load(cfg.SealKeyFile)
	}
	gen := filepath.Join(cfg.DataDir, genSealKeyFile)
	if _, err := os.Stat(gen); err == nil {
		return seal.Load(gen)
	}
	if _, err := os.Stat(filepath.Join(credsDir(cfg.DataDir), certFile)); errors.Is(err, os.ErrNotExist) && Initialized(cfg.DataDir) {
		return nil, errdefs.FailedPrecondition("%s holds Raft state of a corral without node certificates and sealed secrets: start a new cluster in an empty data dir (corral dev: remove its data dir)", cfg.DataDir)
	}
	if !cfg.Bootstrap || Initialized(cfg.DataDir) {
		return nil, errdefs.InvalidArgument("node %s needs the cluster's seal key (--seal-key-file): copy it from a member", cfg.ID)
	}
	id, err := seal.Create(gen)
	if err != nil {
		return nil, err
	}
	log.Warn("generated a seal key for the new cluster: every node that joins needs a copy (--seal-key-file); keep one off this machine too, secrets in Raft cannot be read without it",
		"seal_key_file", gen, "seal_key_id", id)
	return seal.Load(gen)
}

// bootstrapCreds makes the nodes' CA and this node's certificate for a new
// cluster, and keeps the CA's key sealed beside them until Raft holds it.
func bootstrapCreds(dataDir string, ring *seal.Keyring, id string) (*creds, error) {
	ca, err := hostpki.NewCA("corral nodes CA")
	if err != nil {
		return nil, err
	}
	cert, err := ca.IssueNode(id)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(credsDir(dataDir), 0o700); err != nil {
		return nil, err
	}
	if err := writeSealedKey(filepath.Join(credsDir(dataDir), caKeyFile), ring, SealNodeCAKey, ca.MarshalKey); err != nil {
		return nil, err
	}
	if err := writeCreds(dataDir, ring, cert, ca.Cert.Raw); err != nil {
		return nil, err
	}
	return &creds{ca: ca.Cert, cert: cert, id: id}, nil
}

// streamLayer is the Raft transport's mutual TLS: both sides present node
// certificates from the nodes' CA. A peer without one fails the handshake,
// before Raft decodes a byte.
type streamLayer struct {
	ln   net.Listener
	addr net.Addr
	dial *tls.Config
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(bind string, c *creds) (*streamLayer, error) {
	tcp, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	addr := tcp.Addr().(*net.TCPAddr)
	if addr.IP == nil || addr.IP.IsUnspecified() {
		tcp.Close()
		return nil, errdefs.InvalidArgument("raft address %s: want a concrete host, peers dial it", bind)
	}
	return &streamLayer{
		ln:   tls.NewListener(tcp, hostpki.NodeServerTLS(c.ca, c.cert)),
		addr: addr,
		dial: hostpki.NodeClientTLS(c.ca, c.cert),
	}, nil
}

func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return &handshakeConn{Conn: c.(*tls.Conn)}, nil
}

func (s *streamLayer) Close() error   { return s.ln.Close() }
func (s *streamLayer) Addr() net.Addr { return s.addr }

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), s.dial)
}

// handshakeConn completes the TLS handshake, within handshakeTimeout,
// before the first byte is read or written: Raft's accept loop hands the
// connection to its own goroutine, so a slow peer holds only that one.
type handshakeConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		_ = c.Conn.SetDeadline(time.Now().Add(handshakeTimeout))
		c.err = c.Conn.Handshake()
		_ = c.Conn.SetDeadline(time.Time{})
		if c.err != nil {
			_ = c.Conn.Close()
		}
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// forwardingTLS is the forwarding endpoint's server config: nodes with a
// node certificate, or a joining node asking for the join server name (which
// reaches only the token exchange).
func forwardingTLS(c *creds) *tls.Config {
	nodes := hostpki.NodeServerTLS(c.ca, c.cert)
	join := hostpki.NodeJoinServerTLS(c.cert)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			if h.ServerName == hostpki.NodeJoinServerName {
				return join, nil
			}
			return nodes, nil
		},
	}
}

// callerKey carries the verified node id of a forwarded call's caller.
type callerKey struct{}

// callerOf names who made a call: the node whose certificate the
// forwarding endpoint verified, or this node itself.
func (n *Node) callerOf(ctx context.Context) string {
	if id, ok := ctx.Value(callerKey{}).(string); ok {
		return "node:" + id
	}
	return "node:" + n.cfg.ID + " (local)"
}

var errNoNodeCert = errdefs.Unauthenticated("a node certificate from the cluster's CA is required")
