package egress

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"sync"
	"time"
)

// CA is a host agent's certificate authority for the proxy's credential
// injection: it mints the leaf certificates the proxy presents to a
// sandbox when it terminates TLS toward a host a credential is for. It is
// made at agent start and lives in memory only: its key is never written
// anywhere, so a restarted agent has a new CA (and the next tool call
// stages its certificate into the sandbox again).
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	// leafKey signs every leaf's handshakes: one key for all leaves,
	// which saves a key generation per name and is as secret as key.
	leafKey *ecdsa.PrivateKey
	now     func() time.Time

	// mu guards leaves and order.
	mu     sync.Mutex
	leaves map[string]*list.Element // of *leafEntry, by name
	order  *list.List               // most recently used first
}

type leafEntry struct {
	name string
	cert *tls.Certificate
}

// Lifetimes and bounds of the CA's certificates.
const (
	caLifetime   = 5 * 365 * 24 * time.Hour
	leafLifetime = 7 * 24 * time.Hour
	// leafRenew mints a cached leaf anew when it has less than this left.
	leafRenew = 24 * time.Hour
	// maxLeaves bounds the cache of leaves: the names are the sandboxes'
	// credential hosts, a few per session.
	maxLeaves = 1024
	// backdate covers clocks a little behind the host's.
	backdate = 5 * time.Minute
)

// NewCA makes a CA with a fresh ECDSA P-256 key.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"corral"}, CommonName: "corral egress proxy CA " + host},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key: key, leafKey: leafKey, now: time.Now,
		leaves: map[string]*list.Element{}, order: list.New(),
	}, nil
}

// CertPEM is the CA's certificate, PEM-encoded: what a sandbox trusts.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// Certificate is the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// systemBundles are where Linux distributions keep the system's roots.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/ca-bundle.pem",             // openSUSE
	"/etc/ssl/cert.pem",
}

// maxBundle bounds the system bundle read from the host.
const maxBundle = 4 << 20

// Bundle is what a sandbox's tools are pointed at (SSL_CERT_FILE and the
// like): the CA's certificate, then the host's system roots, so that TLS
// to hosts the proxy does not terminate keeps verifying. A host without a
// readable system bundle gets the CA alone.
func (ca *CA) Bundle() []byte {
	out := ca.CertPEM()
	for _, p := range systemBundles {
		b, err := os.ReadFile(p)
		if err != nil || len(b) > maxBundle {
			continue
		}
		out = append(out, '\n')
		return append(out, b...)
	}
	return out
}

// leaf returns a certificate for name signed by the CA, from the cache
// while it has more than leafRenew left.
func (ca *CA) leaf(name string) (*tls.Certificate, error) {
	if !validName(name) {
		return nil, errors.New("not a host name")
	}
	now := ca.now()
	ca.mu.Lock()
	if e, ok := ca.leaves[name]; ok {
		le := e.Value.(*leafEntry)
		if le.cert.Leaf.NotAfter.Sub(now) > leafRenew {
			ca.order.MoveToFront(e)
			ca.mu.Unlock()
			return le.cert, nil
		}
	}
	ca.mu.Unlock()
	notAfter := now.Add(leafLifetime)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("minting a certificate for %s: %w", name, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	cert := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: parsed}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if e, ok := ca.leaves[name]; ok {
		ca.order.Remove(e)
	}
	ca.leaves[name] = ca.order.PushFront(&leafEntry{name: name, cert: cert})
	for ca.order.Len() > maxLeaves {
		last := ca.order.Back()
		ca.order.Remove(last)
		delete(ca.leaves, last.Value.(*leafEntry).name)
	}
	return cert, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// UpstreamRoots is the host's system roots plus the PEM certificates in
// files (--egress-upstream-ca: an internal mirror's CA): what the proxy
// verifies an upstream it terminates TLS toward against.
func UpstreamRoots(files []string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s holds no PEM certificate", f)
		}
	}
	return pool, nil
}
