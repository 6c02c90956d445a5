package hostpki

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"

	"corral.dev/corral/internal/errdefs"
)

func TestNodeIdentityIsNotAHostsOrAnotherCAs(t *testing.T) {
	nodes, err := NewCA("nodes")
	if err != nil {
		t.Fatal(err)
	}
	node, err := nodes.IssueNode("n1")
	if err != nil {
		t.Fatal(err)
	}
	if id, err := NodeID(node.Leaf); err != nil || id != "n1" {
		t.Fatalf("node id %q %v", id, err)
	}
	// The nodes' CA signing a host-style certificate (no node URI): never a node.
	_, csr, err := NewKeyAndCSR("n1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := nodes.SignHost(csr, "n1", 0)
	if err != nil {
		t.Fatal(err)
	}
	hostLike, _ := x509.ParseCertificate(der)
	if _, err := NodeID(hostLike); errdefs.KindOf(err) != errdefs.UnauthenticatedKind {
		t.Fatalf("a certificate without the node URI: %v", err)
	}
	state := func(leaf *x509.Certificate) tls.ConnectionState {
		return tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf, nodes.Cert}}}
	}
	if err := verifiedNode(state(node.Leaf)); err != nil {
		t.Fatalf("a node certificate: %v", err)
	}
	if err := verifiedNode(state(hostLike)); err == nil {
		t.Fatal("the handshake check admitted a certificate without the node URI")
	}
	if err := verifiedNode(tls.ConnectionState{}); err == nil {
		t.Fatal("the handshake check admitted no certificate")
	}
	// A node CSR is signed for the id the signer names, whatever it asks.
	_, ncsr, _ := NewNodeKeyAndCSR("evil")
	nder, err := nodes.SignNode(ncsr, "n2", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(nder)
	if id, _ := NodeID(leaf); id != "n2" || leaf.Subject.CommonName != "n2" {
		t.Fatalf("signed for %q (%s), want n2", id, leaf.Subject.CommonName)
	}
	if _, err := nodes.SignNode(ncsr, "bad id/", 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a bad node id: %v", err)
	}
}

func TestNodeJoinTokenForm(t *testing.T) {
	ca, _ := NewCA("nodes")
	tok, err := NewNodeJoinToken(ca.Cert)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseNodeJoinToken(tok.Reveal())
	if err != nil || got.Secret != tok.Secret || got.CAPin != ca.Pin() {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if strings.Contains(tok.String(), tok.Secret.Reveal()) {
		t.Fatal("String shows the secret")
	}
	host, _ := NewJoinToken(ca)
	for _, bad := range []string{host.Reveal(), "corralnode1.x", "corralnode1.x." + strings.Repeat("G", 64), ""} {
		if _, err := ParseNodeJoinToken(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
