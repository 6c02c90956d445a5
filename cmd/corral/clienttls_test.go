package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The verbs speak plaintext to loopback only (or with --insecure); anything
// else is TLS, verified.
func TestClientTLSChoosesByAddress(t *testing.T) {
	tests := []struct {
		addr     string
		ca       bool
		insecure bool
		want     string // "tls", "plaintext" or a substring of the error
	}{
		{addr: "127.0.0.1:8090", want: "plaintext"},
		{addr: "localhost:8090", want: "plaintext"},
		{addr: "[::1]:8090", want: "plaintext"},
		{addr: "127.0.0.1:8090", ca: true, want: "tls"},
		{addr: "https://127.0.0.1:8090", want: "tls"},
		{addr: "corral.example:8090", want: "tls"},
		{addr: "10.0.0.1:8090", want: "tls"},
		{addr: "http://127.0.0.1:8090", ca: true, want: "plaintext"},
		{addr: "http://10.0.0.1:8090", want: "refusing to send credentials in plaintext"},
		{addr: "http://10.0.0.1:8090", insecure: true, want: "plaintext"},
		{addr: "10.0.0.1:8090", insecure: true, want: "plaintext"},
		{addr: "ftp://10.0.0.1:8090", want: "unknown scheme"},
		{addr: "10.0.0.1", want: "want host:port"},
	}
	caFile := ""
	for _, tt := range tests {
		c := clientTLS{insecure: tt.insecure}
		if tt.ca {
			if caFile == "" {
				caFile = writeTestCA(t)
			}
			c.caFile = caFile
		}
		_, creds, _, err := c.credentials(tt.addr)
		got := ""
		switch {
		case err != nil:
			got = err.Error()
		case creds.Info().SecurityProtocol == "tls":
			got = "tls"
		default:
			got = "plaintext"
		}
		if !strings.Contains(got, tt.want) {
			t.Errorf("%s (ca %t, insecure %t): %s, want %s", tt.addr, tt.ca, tt.insecure, got, tt.want)
		}
	}
}

// writeTestCA writes a self-signed CA certificate and returns its path.
func writeTestCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
