package certreload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"corral.dev/corral/internal/waitfor"
)

// writePair writes a self-signed certificate named cn and its key.
func writePair(t *testing.T, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     []string{cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	replace(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	replace(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return certFile, keyFile
}

// replace writes path by renaming a new file over it, as rotation tools do.
func replace(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func served(t *testing.T, r *Reloader) string {
	t.Helper()
	c, err := r.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.Subject.CommonName
}

func TestNewRefusesABadPair(t *testing.T) {
	dir := t.TempDir()
	certFile, _ := writePair(t, dir, "a")
	other := t.TempDir()
	_, otherKey := writePair(t, other, "b")
	if _, err := New(certFile, otherKey, nil); err == nil {
		t.Fatal("a certificate with another's key loaded")
	}
	if _, err := New(certFile, filepath.Join(dir, "missing"), nil); err == nil {
		t.Fatal("a missing key loaded")
	}
}

func TestReloadKeepsThePreviousPairWhenTheNewOneIsBad(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first")
	r, err := New(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	replace(t, keyFile, []byte("not a key"))
	if err := r.Reload(); err == nil {
		t.Fatal("a garbage key reloaded")
	}
	if got := served(t, r); got != "first" {
		t.Fatalf("after a bad reload serving %q, want the previous pair", got)
	}
	writePair(t, dir, "second")
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := served(t, r); got != "second" {
		t.Fatalf("serving %q after reload, want second", got)
	}
}

// TestRunReloadsOnSignalAndOnChange: a SIGHUP reloads at once (the poll is
// an hour away), and with a short poll a replaced pair is picked up alone.
func TestRunReloadsOnSignalAndOnChange(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first")
	r, err := New(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() { r.run(ctx, time.Hour, hup); close(done) }()
	writePair(t, dir, "signalled")
	hup <- os.Interrupt
	waitfor.Cond(t, 10*time.Second, "the reload on SIGHUP", func() bool { return served(t, r) == "signalled" })
	cancel()
	<-done

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go r.run(ctx, 20*time.Millisecond, nil)
	writePair(t, dir, "polled")
	waitfor.Cond(t, 10*time.Second, "the reload on a file change", func() bool { return served(t, r) == "polled" })
}
