package integration

import (
	"bytes"
	"context"
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
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/hostagent/driver/containerd"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
	"corral.dev/corral/hostagent/egress"
	"corral.dev/corral/internal/waitfor"
)

// localhostTLS starts a TLS server for localhost whose certificate comes
// from a CA of its own, written as PEM to a file (what the dev host's
// --egress-upstream-ca reads).
func localhostTLS(t *testing.T, h http.Handler) (*httptest.Server, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "integration upstream CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafT := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafT, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(h)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}}
	s.StartTLS()
	t.Cleanup(s.Close)
	file := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return s, file
}

// credProbe runs in the sandbox: HTTPS to the upstream through the
// host's proxy, verified against the default roots (the egress CA bundle
// the session's commands are pointed at), with $TOKEN (a credential for
// localhost) and $OTHER_TOKEN (a credential for another host) in headers.
// The upstream answers the SHA-256 of each, so the sandbox never sees
// what it received. (No semicolons: the fake model's script splits on
// them.)
const credProbe = `import os, sys, urllib.request as u
r = u.Request("https://localhost:%s/echo-headers" % sys.argv[1], headers={"Authorization": "Bearer " + os.environ["TOKEN"], "X-Other": os.environ["OTHER_TOKEN"]})
print("GOT " + u.urlopen(r, timeout=20).read().decode())
`

// TestDevEgressCredential: through corral dev and the official SDK, a
// vault with environment_variable credentials for localhost (TOKEN) and
// for another host (OTHER_TOKEN) gives the session's gVisor sandbox only
// placeholders; a request to localhost leaves the host's proxy with
// TOKEN's secret in its header and OTHER_TOKEN's placeholder as it was
// sent; the sandbox verifies the proxy's certificate with the staged CA
// bundle, and the secrets are nowhere inside it (its environment, its
// processes', its files).
func TestDevEgressCredential(t *testing.T) {
	requireGVisor(t)
	const secret, otherSecret = "sk-dev-9f8e7d6c5b4a-token", "sk-dev-other-1a2b3c4d"
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	var mu sync.Mutex
	var seen http.Header
	up, caFile := localhostTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		fmt.Fprintf(w, "%s %s", sum(r.Header.Get("Authorization")), sum(r.Header.Get("X-Other")))
	}))
	port := up.Listener.Addr().(*net.TCPAddr).Port

	dir := dataDir(t)
	containerdtest.Sweep(t, containerd.Config{Address: containerdAddress(), Runtime: containerd.RuntimeGVisor,
		StateDir: filepath.Join(dir, "host", "containerd")})
	grpcAddr := freeAddr(t)
	dev := startDev(t, dir, "--http-addr", freeAddr(t), "--grpc-addr", grpcAddr, "--runtime", "gvisor", "--no-warm-pools",
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-upstream-ca", caFile)
	dev.waitListening(t)
	env := readEnv(t, dir)
	client := anthropic.NewClient(option.WithBaseURL(env["CORRAL_URL"]), option.WithAPIKey(env["CORRAL_API_KEY"]),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	envr, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "creds",
		Config: anthropic.BetaEnvironmentNewParamsConfigUnion{OfCloud: &anthropic.BetaCloudConfigParams{Networking: anthropic.BetaCloudConfigParamsNetworkingUnion{
			OfLimited: &anthropic.BetaLimitedNetworkParams{AllowedHosts: []string{"localhost"}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	vault, err := client.Beta.Vaults.New(ctx, anthropic.BetaVaultNewParams{DisplayName: "creds"})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string][2]string{"TOKEN": {secret, "localhost"}, "OTHER_TOKEN": {otherSecret, "api.other.example"}} {
		if _, err := client.Beta.Vaults.Credentials.New(ctx, vault.ID, anthropic.BetaVaultCredentialNewParams{
			Auth: anthropic.BetaVaultCredentialNewParamsAuthUnion{OfEnvironmentVariable: &anthropic.BetaManagedAgentsEnvironmentVariableCreateParams{
				SecretName: name, SecretValue: c[0],
				Networking: anthropic.BetaManagedAgentsCredentialNetworkingParamsUnion{OfLimited: &anthropic.BetaManagedAgentsLimitedCredentialNetworkingParams{AllowedHosts: []string{c[1]}}},
			}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{
		Name:  "creds",
		Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"},
		Tools: []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
		Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: envr.ID, VaultIDs: []string{vault.ID},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { egress.Remove(context.Background(), sess.ID) })
	s := client.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()
	// Two bash calls: the probe, then everything in the sandbox that
	// could hold a secret (grep prints the names of files that do). The
	// command names each secret in two quoted halves, which the shell
	// joins: the session's events (stored in PostgreSQL) never hold it.
	split := func(s string) string { return "'" + s[:len(s)/2] + "''" + s[len(s)/2:] + "'" }
	results := bashTurns(t, ctx, client, sess.ID, s,
		fmt.Sprintf("python3 -c '%s' %d", credProbe, port),
		"env | grep -c corral-placeholder- && cat /proc/*/environ | tr '\\0' '\\n' && grep -rl -e "+split(secret)+" -e "+split(otherSecret)+" /workspace /mnt /tmp | sed 's/^/LEAK: /'",
	)
	if len(results) != 2 {
		t.Fatalf("tool results: %q", results)
	}
	mu.Lock()
	got := seen
	mu.Unlock()
	if got.Get("Authorization") != "Bearer "+secret {
		t.Errorf("the upstream saw Authorization %q, want TOKEN's secret", got.Get("Authorization"))
	}
	other := got.Get("X-Other")
	if !strings.HasPrefix(other, "corral-placeholder-") {
		t.Errorf("the upstream saw X-Other %q, want OTHER_TOKEN's placeholder (its credential is for another host)", other)
	}
	if want := "GOT " + sum("Bearer "+secret) + " " + sum(other); strings.TrimSpace(results[0]) != want {
		t.Errorf("the sandbox's fetch: %q, want %q", results[0], want)
	}
	inside := results[1]
	if strings.Contains(inside, secret) || strings.Contains(inside, otherSecret) || strings.Contains(inside, "LEAK: ") {
		t.Errorf("a secret is in the sandbox:\n%s", inside)
	}
	if !strings.HasPrefix(inside, "2\n") || !strings.Contains(inside, "OTHER_TOKEN="+other) || !strings.Contains(inside, "SSL_CERT_FILE=/mnt/session/uploads/.corral/ca-bundle.pem") {
		t.Errorf("the sandbox's environment lacks the placeholders or the CA bundle:\n%s", inside)
	}

	// The egress trail says a credential was injected, never which.
	var out []byte
	waitfor.Cond(t, 2*time.Minute, "the injected connection in the egress trail", func() bool {
		out, _ = exec.Command(corralBin, "egress", "ls", "--server", grpcAddr, "--api-key", env["CORRAL_API_KEY"], "--session", sess.ID).CombinedOutput()
		return strings.Contains(string(out), "allowed,credential")
	})
	if strings.Contains(string(out), secret) || strings.Contains(string(out), other) {
		t.Errorf("the trail names the secret or the placeholder:\n%s", out)
	}

	// Nor is a secret in the node's log or in any file of its data
	// directory: PostgreSQL's (ciphertext only), Raft's, the host agent's
	// state, containerd's and the sandbox's.
	if log := dev.stderr.String(); strings.Contains(log, secret) || strings.Contains(log, otherSecret) {
		t.Error("a secret is in corral dev's log")
	}
	files := 0
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil // gone meanwhile, or not a file
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		files++
		if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte(otherSecret)) {
			t.Errorf("a secret is in %s", path)
		}
		return nil
	})
	if err != nil || files < 100 {
		t.Fatalf("walked %d files of %s: %v", files, dir, err)
	}
}
