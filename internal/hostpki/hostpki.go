// Package hostpki is the small certificate authority that joins hosts to the
// control plane: an ECDSA P-256 CA, host certificates issued from CSRs,
// one-time join tokens (random, stored hashed, single use, expiring) and the
// tls.Configs for mutual TLS in both directions.
//
// Names are identities. A host certificate's subject and only DNS name are
// the host id; the control plane's certificate is named ControlPlaneName.
// Each side dials with the other's name as the TLS server name, so neither
// depends on IP addresses in certificates.
//
//	host                                  control plane (CA)
//	 │ Join(token, host id, CSR) ──TLS, CA pinned by token──▶ │ consume token, sign CSR
//	 │ ◀──────────────────────── host cert + CA cert ───────── │
//	 │ Connect ──mTLS (host cert)──────────────────────────▶   │ peer name = host id
//	 │ ◀──mTLS (control-plane cert)── SandboxService calls     │
//
// Control-plane nodes use the same CA type with identities of their own
// (node.go): a separate nodes' CA, node certificates naming the node in a
// URI SAN, and node join tokens of their own printed form, so a host's
// certificate or token never passes for a node's.
//
// It lives under internal because both daemons need it: the control plane
// signs, the host agent asks.
package hostpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"corral.dev/corral/internal/errdefs"
)

// ControlPlaneName is the subject and DNS name of the control plane's
// certificate, and the server name hosts verify.
const ControlPlaneName = "corral-control-plane"

// DefaultCertTTL is how long issued certificates last.
const DefaultCertTTL = 365 * 24 * time.Hour

// CA signs host and control-plane certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// Now is the clock used for validity periods; time.Now by default.
	Now func() time.Time
}

// NewCA creates a CA with a fresh key, valid for ten years.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"corral"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, Now: time.Now}, nil
}

// LoadOrCreateCA reads ca.pem and ca-key.pem from dir, creating both (key
// 0600) when absent.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if _, err := os.Stat(certPath); err == nil {
		cert, err := ReadCertPEM(certPath)
		if err != nil {
			return nil, err
		}
		key, err := ReadKeyPEM(keyPath)
		if err != nil {
			return nil, err
		}
		return &CA{Cert: cert, key: key, Now: time.Now}, nil
	}
	ca, err := NewCA(name)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := WriteKeyPEM(keyPath, ca.key); err != nil {
		return nil, err
	}
	if err := WriteFileAtomic(certPath, CertPEM(ca.Cert.Raw), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// Pin is the hex SHA-256 of the CA certificate: what a join token carries so
// that a new host can trust the control plane before it has the CA.
func (ca *CA) Pin() string { return Pin(ca.Cert.Raw) }

// Pin is the hex SHA-256 of a DER certificate.
func Pin(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

var hostIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateHostID checks that id is a DNS label.
func ValidateHostID(id string) error {
	if !hostIDPattern.MatchString(id) || id == ControlPlaneName {
		return errdefs.InvalidArgument("host id %q: want a DNS label (a-z, 0-9, '-', at most 63) other than %s", id, ControlPlaneName)
	}
	return nil
}

// SignHost checks a host's CSR and issues its certificate, DER. The subject
// and DNS name are hostID whatever the CSR asks for.
func (ca *CA) SignHost(csrDER []byte, hostID string, ttl time.Duration) ([]byte, error) {
	if err := ValidateHostID(hostID); err != nil {
		return nil, err
	}
	pub, err := csrKey(csrDER)
	if err != nil {
		return nil, err
	}
	return ca.issue(pub, hostID, ttl)
}

// csrKey parses a CSR, checks its signature, and returns its key, which
// must be ECDSA P-256 (what Join and node joins generate).
func csrKey(csrDER []byte) (*ecdsa.PublicKey, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "parsing CSR")
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "CSR signature")
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, errdefs.InvalidArgument("CSR key: want ECDSA P-256")
	}
	return pub, nil
}

func (ca *CA) issue(pub *ecdsa.PublicKey, name string, ttl time.Duration) ([]byte, error) {
	return ca.sign(pub, pkix.Name{CommonName: name, Organization: []string{"corral"}}, []string{name}, nil, ttl)
}

// sign issues a certificate for pub, for both TLS server and client use,
// valid for ttl (DefaultCertTTL when zero) but never past the CA's own.
func (ca *CA) sign(pub *ecdsa.PublicKey, subject pkix.Name, dnsNames []string, uris []*url.URL, ttl time.Duration) ([]byte, error) {
	if ttl <= 0 {
		ttl = DefaultCertTTL
	}
	now := ca.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		DNSNames:     dnsNames,
		URIs:         uris,
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", subject.CommonName, err)
	}
	return der, nil
}

// IssueControlPlane makes a key and certificate for the control plane, with
// the CA certificate in the chain (a joining host checks it against its pin).
func (ca *CA) IssueControlPlane(ttl time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := ca.issue(&key.PublicKey, ControlPlaneName, ttl)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// NewKeyAndCSR makes a host key and a CSR for it.
func NewKeyAndCSR(hostID string) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: hostID},
		DNSNames: []string{hostID},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CSR: %w", err)
	}
	return key, csr, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// CertPEM encodes a DER certificate as PEM.
func CertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// ReadCertPEM reads one PEM certificate.
func ReadCertPEM(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errdefs.InvalidArgument("%s: no PEM certificate", path)
	}
	return x509.ParseCertificate(blk.Bytes)
}

// WriteKeyPEM writes an EC private key, mode 0600, atomically.
func WriteKeyPEM(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// ReadKeyPEM reads an EC private key written by WriteKeyPEM.
func ReadKeyPEM(path string) (*ecdsa.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return nil, errdefs.InvalidArgument("%s: no PEM EC private key", path)
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory, synced and renamed, so a crash leaves the old or the new file.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	return writeRenamed(path, data, mode, true)
}

// WriteFileRenamed is WriteFileAtomic without the syncs: a reader sees the
// old file or the whole new one, as long as the machine does not crash
// before the kernel writes it (then the new one may be empty or cut).
func WriteFileRenamed(path string, data []byte, mode os.FileMode) error {
	return writeRenamed(path, data, mode, false)
}

func writeRenamed(path string, data []byte, mode os.FileMode, sync bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// PEM encodes the CA's certificate and key, for replicating it.
func (ca *CA) PEM() (certPEM, keyPEM []byte, err error) {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, nil, err
	}
	return CertPEM(ca.Cert.Raw), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// ParseCA decodes a CA encoded by PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil || kb.Type != "EC PRIVATE KEY" {
		return nil, errdefs.InvalidArgument("CA: want a PEM certificate and a PEM EC private key")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "CA certificate")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "CA key")
	}
	return &CA{Cert: cert, key: key, Now: time.Now}, nil
}
