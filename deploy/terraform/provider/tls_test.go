package provider

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"

	"corral.dev/corral/controlplane/server"
)

// TestOverTLS configures the provider with a private CA (ca_pem) for a
// node serving TLS on both APIs, and checks that a CA that did not sign
// the node's certificate fails the handshake, on either API, with a
// diagnostic that says what to set.
func TestOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caPEM, roots := issueServerCert(t, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	otherPEM, _ := issueServerCert(t, filepath.Join(dir, "other.crt"), filepath.Join(dir, "other.key"))
	e := setupWith(t, server.Config{NodeID: "tf-tls", TLSCertFile: filepath.Join(dir, "tls.crt"), TLSKeyFile: filepath.Join(dir, "tls.key")}, roots)
	provider := func(ca string) string {
		return fmt.Sprintf(`
provider "corral" {
  url          = "https://%s"
  grpc_addr    = "%s"
  operator_key = %q
  api_key      = %q
  ca_pem       = %q
}
`, e.srv.HTTPAddr(), e.srv.GRPCAddr(), e.operatorKey, e.apiKey, ca)
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: e.factories(),
		Steps: []resource.TestStep{
			// The wrong CA first: the destroy at the end uses the last
			// step's provider settings.
			{
				Config:      provider(otherPEM) + `data "corral_cluster" "c" {}`,
				ExpectError: regexp.MustCompile(`(?s)Reading the cluster.s status.*give\s+the\s+CA\s+that\s+signed\s+its\s+certificate\s+with\s+ca_file,\s+ca_pem\s+or\s+\$CORRAL_TLS_CA`),
			},
			{
				Config:      provider(otherPEM) + `resource "corral_vault" "v" { display_name = "over tls" }`,
				ExpectError: regexp.MustCompile(`(?s)Creating a vault.*give\s+the\s+CA\s+that\s+signed\s+its\s+certificate`),
			},
			{
				Config: provider(caPEM) + `
data "corral_cluster" "c" {}
resource "corral_vault" "v" { display_name = "over tls" }
`,
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("data.corral_cluster.c", "node_id", "tf-tls"),
					resource.TestCheckResourceAttrSet("corral_vault.v", "id"),
				),
			},
		},
	})
}

// issueServerCert makes a CA and a certificate it signs for loopback,
// written to certFile and keyFile; it returns the CA as PEM and as a pool.
func issueServerCert(t *testing.T, certFile, keyFile string) (string, *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "corral test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "corral server"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), pool
}
