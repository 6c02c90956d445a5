package hostpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// Control-plane nodes authenticate each other with certificates from the
// nodes' CA, a CA of its own (never the hosts' CA). A node certificate
// names its node in a URI SAN, corral://node/<id>, and every node carries
// the DNS name NodeServerName, the server name nodes dial each other with.
// A certificate without the URI, such as a host's, never passes as a node's,
// whichever CA signed it.
const (
	NodeServerName = "corral-node"
	nodeURIScheme  = "corral"
	nodeURIHost    = "node"
	// NodeJoinServerName is the server name (SNI) a joining node asks for:
	// the one handshake a node's forwarding endpoint completes without a
	// client certificate, and it reaches nothing but the token exchange.
	NodeJoinServerName = "corral-node-join"
)

// NodeURI is the URI SAN naming node id.
func NodeURI(id string) *url.URL {
	return &url.URL{Scheme: nodeURIScheme, Host: nodeURIHost, Path: "/" + id}
}

// NodeID returns the node a certificate names, or an error of kind
// unauthenticated when it names none (a host's certificate, say).
func NodeID(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if u.Scheme == nodeURIScheme && u.Host == nodeURIHost && strings.HasPrefix(u.Path, "/") {
			id := strings.TrimPrefix(u.Path, "/")
			if ValidateNodeID(id) == nil {
				return id, nil
			}
		}
	}
	return "", errdefs.Unauthenticated("certificate %q is not a control-plane node's", cert.Subject.CommonName)
}

// ValidateNodeID checks that id can name a node in a certificate: 1 to
// 128 letters, digits, '.', '_' or '-'.
func ValidateNodeID(id string) error {
	if id == "" || len(id) > 128 {
		return errdefs.InvalidArgument("node id %q: want 1 to 128 characters", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return errdefs.InvalidArgument("node id %q: want letters, digits, '.', '_' or '-'", id)
		}
	}
	return nil
}

// SignNode checks a node's CSR and issues its certificate, DER, named
// nodeID whatever the CSR asks for.
func (ca *CA) SignNode(csrDER []byte, nodeID string, ttl time.Duration) ([]byte, error) {
	if err := ValidateNodeID(nodeID); err != nil {
		return nil, err
	}
	pub, err := csrKey(csrDER)
	if err != nil {
		return nil, err
	}
	return ca.issueNode(pub, nodeID, ttl)
}

func (ca *CA) issueNode(pub *ecdsa.PublicKey, nodeID string, ttl time.Duration) ([]byte, error) {
	subject := pkix.Name{CommonName: nodeID, Organization: []string{"corral"}, OrganizationalUnit: []string{"control-plane node"}}
	return ca.sign(pub, subject, []string{NodeServerName}, []*url.URL{NodeURI(nodeID)}, ttl)
}

// IssueNode makes a key and a node certificate for nodeID (the bootstrap
// node's own), with the CA certificate in the chain.
func (ca *CA) IssueNode(nodeID string) (tls.Certificate, error) {
	if err := ValidateNodeID(nodeID); err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := ca.issueNode(&key.PublicKey, nodeID, 0)
	if err != nil {
		return tls.Certificate{}, err
	}
	return NodeCertificate(der, ca.Cert.Raw, key)
}

// NodeCertificate assembles a node's tls.Certificate, the CA in its chain
// (a joining node checks it against its token's pin).
func NodeCertificate(der, caDER []byte, key *ecdsa.PrivateKey) (tls.Certificate, error) {
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key, Leaf: leaf}, nil
}

// NewNodeKeyAndCSR makes a node key and a CSR for it.
func NewNodeKeyAndCSR(nodeID string) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: nodeID},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CSR: %w", err)
	}
	return key, csr, nil
}

// verifiedNode checks a verified chain's leaf is a node certificate.
func verifiedNode(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return errors.New("no verified node certificate")
	}
	_, err := NodeID(cs.VerifiedChains[0][0])
	return err
}

// NodeServerTLS is the config of a node's Raft listener and of its
// forwarding endpoint for nodes: the client must present a node
// certificate from ca, or the handshake fails.
func NodeServerTLS(ca *x509.Certificate, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		ClientCAs:        pool(ca),
		ClientAuth:       tls.RequireAndVerifyClientCert,
		VerifyConnection: verifiedNode,
	}
}

// NodeClientTLS is the config a node dials another with: it presents cert
// and accepts only a node certificate from ca.
func NodeClientTLS(ca *x509.Certificate, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		RootCAs:          pool(ca),
		ServerName:       NodeServerName,
		Certificates:     []tls.Certificate{cert},
		VerifyConnection: verifiedNode,
	}
}

// NodeJoinServerTLS is the config of the token exchange (server name
// NodeJoinServerName): no client certificate.
func NodeJoinServerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.NoClientCert,
	}
}

// PinnedNodeClientTLS is the config a new node joins with: it has no CA
// yet, so it accepts the member only if the chain it sends holds a CA whose
// pin is the token's, and that CA signed a node certificate for the leaf.
func PinnedNodeClientTLS(caPin string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by the pin check below
		ServerName:         NodeJoinServerName,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			leaf, err := verifyPinned(raw, caPin, NodeServerName, "the cluster's node CA")
			if err != nil {
				return err
			}
			_, err = NodeID(leaf)
			return err
		},
	}
}

// nodeTokenPrefix versions the printed form of a node join token: it differs
// from a host token's, so neither is mistaken for the other.
const nodeTokenPrefix = "corralnode1"

// NodeJoinToken is what an operator hands a new control-plane node: a
// one-time secret and the pin of the nodes' CA. Printed as
// corralnode1.<secret>.<pin>.
type NodeJoinToken struct {
	Secret logging.Secret
	CAPin  string
}

// NewNodeJoinToken makes a fresh node token for nodes that will trust ca.
func NewNodeJoinToken(ca *x509.Certificate) (NodeJoinToken, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return NodeJoinToken{}, err
	}
	return NodeJoinToken{Secret: logging.Secret(base64.RawURLEncoding.EncodeToString(b)), CAPin: Pin(ca.Raw)}, nil
}

// Reveal returns the printed form, secret included.
func (t NodeJoinToken) Reveal() string {
	return nodeTokenPrefix + "." + t.Secret.Reveal() + "." + t.CAPin
}

// String implements fmt.Stringer without the secret.
func (t NodeJoinToken) String() string { return nodeTokenPrefix + ".[redacted]." + t.CAPin }

// ParseNodeJoinToken parses the printed form.
func ParseNodeJoinToken(s string) (NodeJoinToken, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 3 || parts[0] != nodeTokenPrefix || parts[1] == "" || len(parts[1]) > 128 || len(parts[2]) != 64 {
		return NodeJoinToken{}, errdefs.InvalidArgument("node join token: want %s.<secret>.<ca pin>, as `corral admin node-token` prints it", nodeTokenPrefix)
	}
	for _, c := range parts[2] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return NodeJoinToken{}, errdefs.InvalidArgument("node join token: CA pin is not hex")
		}
	}
	return NodeJoinToken{Secret: logging.Secret(parts[1]), CAPin: parts[2]}, nil
}

// MarshalKey encodes the CA's private key, DER (SEC 1), for sealing; the
// caller must not write it anywhere unsealed.
func (ca *CA) MarshalKey() ([]byte, error) { return x509.MarshalECPrivateKey(ca.key) }

// LoadCA rebuilds a CA from its PEM certificate and its DER key (as
// MarshalKey encodes it), checking that they belong together.
func LoadCA(certPEM, keyDER []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errdefs.InvalidArgument("CA: want a PEM certificate")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "CA certificate")
	}
	key, err := x509.ParseECPrivateKey(keyDER)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.InvalidArgumentKind, err, "CA key")
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errdefs.InvalidArgument("CA key does not match its certificate")
	}
	return &CA{Cert: cert, key: key, Now: time.Now}, nil
}
