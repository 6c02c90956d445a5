package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/waitfor"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// writeCert writes the CA's certificate to path.
func (ca *testCA) writeCert(t *testing.T, path string) {
	t.Helper()
	replaceFile(t, path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))
}

// issue writes a server certificate for loopback (127.0.0.1, ::1,
// localhost) with serial to certFile and keyFile, each renamed into place.
func (ca *testCA) issue(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "corral server"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	replaceFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

// replaceFile renames a new file with data over path, as rotation tools do.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial of the certificate addr serves, verified
// against roots; "" with the handshake's error when it fails.
func servedSerial(addr string, roots *x509.CertPool) (string, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// corralCLI runs the corral binary with args and CORRAL_OPERATOR_KEY=key;
// it returns stdout, stderr and whether it succeeded.
func corralCLI(t *testing.T, key string, args ...string) (stdout, stderr string, ok bool) {
	t.Helper()
	cmd := exec.Command(corralBin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_OPERATOR_KEY="+key, "CORRAL_API_KEY=", "CORRAL_TLS_CA=")
	var out, errb syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { <-ctx.Done(); _ = cmd.Process.Kill() }()
	err := cmd.Run()
	return out.String(), errb.String(), err == nil
}

// TestPublicAPIOverTLS: a `corral server` with --tls-cert and --tls-key
// serves the REST API (to the official Go SDK trusting the test's CA) and
// the admin gRPC API (to the CLI with --tls-ca) over TLS only; the CLI
// refuses a server its CA did not sign, saying which flag to set; replacing
// the certificate files swaps the certificate served, and a pair that does
// not load leaves the previous one in place.
func TestPublicAPIOverTLS(t *testing.T) {
	db := pgtest.New(t)
	pki := t.TempDir()
	ca, other := newTestCA(t, "corral test CA"), newTestCA(t, "another CA")
	caFile, otherFile := filepath.Join(pki, "ca.pem"), filepath.Join(pki, "other.pem")
	ca.writeCert(t, caFile)
	other.writeCert(t, otherFile)
	certFile, keyFile := filepath.Join(pki, "tls.crt"), filepath.Join(pki, "tls.key")
	ca.issue(t, 1001, certFile, keyFile)

	n := newServerNode(t, db, "tls-1", "--tls-cert", certFile, "--tls-key", keyFile)
	n.start(t, "--bootstrap")
	if serial, err := servedSerial(n.grpcAddr, ca.pool()); serial != "1001" {
		t.Fatalf("gRPC listener: serial %q, %v", serial, err)
	}
	// TLS 1.1 and older are refused.
	if c, err := tls.Dial("tcp", n.httpAddr, &tls.Config{RootCAs: ca.pool(), MaxVersion: tls.VersionTLS11}); err == nil {
		c.Close()
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
	// Plain HTTP gets no API.
	if resp, err := http.Get("http://" + n.httpAddr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP served /healthz on a TLS listener")
		}
	}

	// The CLI, trusting the CA, makes a tenant and its key over TLS.
	cli := func(args ...string) map[string]any {
		t.Helper()
		out, errOut, ok := corralCLI(t, n.key, append([]string{"admin", "--grpc-addr", n.grpcAddr, "--tls-ca", caFile}, args...)...)
		if !ok {
			t.Fatalf("corral admin %s: %s", strings.Join(args, " "), errOut)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("corral admin %s printed %q: %v", strings.Join(args, " "), out, err)
		}
		return v
	}
	cli("create-tenant", "--tenant", "tenant_tls", "--name", "TLS")
	secret, _ := cli("create-key", "--tenant", "tenant_tls", "--name", "sdk")["secret"].(string)
	if secret == "" {
		t.Fatal("create-key printed no secret")
	}
	if out, errOut, ok := corralCLI(t, n.key, "cluster", "members", "--server", "https://"+n.grpcAddr, "--tls-ca", caFile); !ok || !strings.Contains(out, "tls-1") {
		t.Fatalf("corral cluster members over TLS: %s%s", out, errOut)
	}
	// A wrong CA, or none (the system's roots), fails, naming the server
	// and the flag.
	for _, args := range [][]string{
		{"admin", "--grpc-addr", n.grpcAddr, "--tls-ca", otherFile, "tenants"},
		{"status", "--grpc-addr", "https://" + n.grpcAddr},
		{"hosts", "ls", "--server", n.grpcAddr, "--tls-ca", otherFile},
	} {
		_, errOut, ok := corralCLI(t, n.key, args...)
		if ok || !strings.Contains(errOut, "x509: certificate signed by unknown authority") || !strings.Contains(errOut, n.grpcAddr) || !strings.Contains(errOut, "--tls-ca") {
			t.Fatalf("corral %s: ok %t, stderr %q: want a refusal naming the server, the x509 error and --tls-ca", strings.Join(args, " "), ok, errOut)
		}
		t.Logf("corral %s: %s", strings.Join(args, " "), strings.TrimSpace(errOut))
	}

	// The official SDK, trusting the CA, over https.
	sdk := func(roots *x509.CertPool) anthropic.Client {
		return anthropic.NewClient(
			option.WithBaseURL("https://"+n.httpAddr),
			option.WithAPIKey(secret),
			option.WithHTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}),
			option.WithRequestTimeout(30*time.Second),
			option.WithMaxRetries(0),
		)
	}
	client := sdk(ca.pool())
	ctx := context.Background()
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "tls", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}})
	if err != nil {
		t.Fatalf("Agents.New over TLS: %v", err)
	}
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "tls"})
	if err != nil {
		t.Fatalf("Environments.New over TLS: %v", err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: env.ID,
	})
	if err != nil {
		t.Fatalf("Sessions.New over TLS: %v", err)
	}
	if got, err := client.Beta.Sessions.Get(ctx, sess.ID, anthropic.BetaSessionGetParams{}); err != nil || got.ID != sess.ID {
		t.Fatalf("Sessions.Get over TLS: %v", err)
	}
	wrong := sdk(other.pool())
	if _, err := wrong.Beta.Agents.Get(ctx, agent.ID, anthropic.BetaAgentGetParams{}); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("the SDK trusting another CA: %v", err)
	}

	// Rotation: new files are served once the node sees them.
	ca.issue(t, 1002, certFile, keyFile)
	for _, addr := range []string{n.httpAddr, n.grpcAddr} {
		waitfor.State(t, 30*time.Second, "the new certificate on "+addr, func() (bool, string) {
			serial, err := servedSerial(addr, ca.pool())
			return serial == "1002", serial + " " + errString(err)
		})
	}
	if got, err := client.Beta.Agents.Get(ctx, agent.ID, anthropic.BetaAgentGetParams{}); err != nil || got.ID != agent.ID {
		t.Fatalf("Agents.Get after the reload: %v", err)
	}
	// A pair that does not load, signalled with SIGHUP, is refused and the
	// previous certificate stays.
	replaceFile(t, keyFile, []byte("not a key\n"))
	if err := n.proc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitfor.Cond(t, 30*time.Second, "the node to refuse the broken pair", func() bool {
		return strings.Contains(n.proc.stderr.String(), "TLS certificate not reloaded")
	})
	if serial, err := servedSerial(n.httpAddr, ca.pool()); serial != "1002" {
		t.Fatalf("after a broken pair: serial %q, %v; want the previous certificate", serial, err)
	}
	select {
	case <-n.proc.done:
		t.Fatalf("the node exited after SIGHUP: %v", n.proc.waitErr)
	default:
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestServerRefusesPlaintextBeyondLoopback: without TLS and without
// --insecure-listen, `corral server` on an address beyond loopback exits
// at once, before it listens or reaches its database, saying what to set.
func TestServerRefusesPlaintextBeyondLoopback(t *testing.T) {
	for _, flag := range []string{"--http-addr", "--grpc-addr"} {
		cmd := exec.Command(corralBin, "server", "--data-dir", t.TempDir(), "--database-url", "postgres://corral@127.0.0.1:1/none",
			"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", flag, "0.0.0.0:0")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "refusing to serve "+flag) || !strings.Contains(string(out), "--insecure-listen") || !strings.Contains(string(out), "--tls-cert") {
			t.Fatalf("corral server %s 0.0.0.0:0 without TLS: %v\n%s", flag, err, out)
		}
		if strings.Contains(string(out), "listening") {
			t.Fatalf("corral server listened before refusing:\n%s", out)
		}
	}
}
