package hostpki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// hostCert joins a host the way the agent does: key, CSR, signature.
func hostCert(t *testing.T, ca *CA, id string) tls.Certificate {
	t.Helper()
	key, csr, err := NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignHost(csr, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTokens(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ca := newCA(t)
	toks := NewTokens(func() time.Time { return now })
	good, err := toks.Issue(ca, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := toks.Issue(ca, time.Minute)

	parsed, err := ParseJoinToken(good.Reveal())
	if err != nil || parsed.Secret != good.Secret || parsed.CAPin != ca.Pin() {
		t.Fatalf("round trip: %+v, %v", parsed, err)
	}
	now = now.Add(2 * time.Minute)
	cases := []struct {
		name   string
		secret logging.Secret
		want   string
	}{
		{"first use", good.Secret, ""},
		{"reused", good.Secret, "already used"},
		{"expired", old.Secret, "expired"},
		{"unknown", "nope", "unknown"},
	}
	for _, c := range cases {
		err := toks.Consume(c.secret)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if errdefs.KindOf(err) != errdefs.UnauthenticatedKind || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want unauthenticated %q", c.name, err, c.want)
		}
	}
	for _, bad := range []string{"", "corral1.x", "corral2.a." + ca.Pin(), "corral1.a.zz"} {
		if _, err := ParseJoinToken(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseJoinToken(%q) = %v, want invalid argument", bad, err)
		}
	}
}

func TestTokenNeverPrintsSecret(t *testing.T) {
	tok, err := NewTokens(nil).Issue(newCA(t), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, s := range []string{tok.String(), tok.LogValue().String()} {
		sb.WriteString(s)
	}
	if strings.Contains(sb.String(), tok.Secret.Reveal()) {
		t.Fatalf("secret leaked: %s", sb.String())
	}
}

func TestSignHostNamesTheCertAfterTheHost(t *testing.T) {
	ca := newCA(t)
	_, csr, err := NewKeyAndCSR("evil") // the CSR asks for another name
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignHost(csr, "host-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	if c.Subject.CommonName != "host-1" || len(c.DNSNames) != 1 || c.DNSNames[0] != "host-1" {
		t.Fatalf("cert names %q %v", c.Subject.CommonName, c.DNSNames)
	}
	if _, err := ca.SignHost(csr, "Bad_Name", time.Hour); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad host id: %v", err)
	}
	if _, err := ca.SignHost([]byte("junk"), "host-1", time.Hour); !errdefs.IsInvalidArgument(err) {
		t.Errorf("junk CSR: %v", err)
	}
}

// handshake runs a TLS handshake between the two configs over loopback and
// returns the client's and server's errors.
func handshake(t *testing.T, client, server *tls.Config) (cerr, serr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(10 * time.Second)
	done := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		conn.SetDeadline(deadline)
		s := tls.Server(conn, server)
		err = s.Handshake()
		if err == nil {
			// TLS 1.3 clients finish before the server checks their
			// certificate; a round trip carries the server's verdict.
			_, err = s.Write([]byte{1})
		}
		done <- err
	}()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	c := tls.Client(conn, client)
	cerr = c.Handshake()
	if cerr == nil {
		_, cerr = c.Read(make([]byte, 1))
	}
	conn.Close()
	return cerr, <-done
}

func TestMutualTLS(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	cp, err := ca.IssueControlPlane(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCP, _ := other.IssueControlPlane(time.Hour)
	host := hostCert(t, ca, "host-1")
	host2 := hostCert(t, ca, "host-2")
	strangerHost := hostCert(t, other, "host-1")

	// The host serves SandboxService and admits only the control plane.
	hostServer := ServerTLS(ca.Cert, host, ControlPlaneName, false)
	cases := []struct {
		name   string
		client *tls.Config
		server *tls.Config
		ok     bool
	}{
		{"control plane calls host", ClientTLS(ca.Cert, &cp, "host-1"), hostServer, true},
		{"another host calls host", ClientTLS(ca.Cert, &host2, "host-1"), hostServer, false},
		{"wrong CA's control plane", ClientTLS(ca.Cert, &otherCP, "host-1"), hostServer, false},
		{"no client cert", ClientTLS(ca.Cert, nil, "host-1"), hostServer, false},
		{"wrong server name", ClientTLS(ca.Cert, &cp, "host-2"), hostServer, false},
		{"host dials control plane", ClientTLS(ca.Cert, &host, ControlPlaneName), ServerTLS(ca.Cert, cp, "", true), true},
		{"wrong CA's host dials", ClientTLS(other.Cert, &strangerHost, ControlPlaneName), ServerTLS(ca.Cert, cp, "", true), false},
		{"join with right pin", PinnedClientTLS(ca.Pin()), ServerTLS(ca.Cert, cp, "", true), true},
		{"join with wrong pin", PinnedClientTLS(other.Pin()), ServerTLS(ca.Cert, cp, "", true), false},
		{"join, impostor with the pinned CA in its chain", PinnedClientTLS(ca.Pin()), ServerTLS(other.Cert, tls.Certificate{Certificate: [][]byte{otherCP.Certificate[0], ca.Cert.Raw}, PrivateKey: otherCP.PrivateKey}, "", true), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cerr, serr := handshake(t, c.client, c.server)
			if ok := cerr == nil && serr == nil; ok != c.ok {
				t.Fatalf("client err %v, server err %v; want ok=%v", cerr, serr, c.ok)
			}
		})
	}
}

func TestLoadOrCreateCAPersists(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreateCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	if a.Pin() != b.Pin() {
		t.Fatal("second load made a new CA")
	}
	st, err := os.Stat(filepath.Join(dir, "ca-key.pem"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st.Mode(), err)
	}
	// The loaded CA still signs certificates the first one's pool accepts.
	h := hostCert(t, b, "host-9")
	leaf, _ := x509.ParseCertificate(h.Certificate[0])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(a.Cert), DNSName: "host-9", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
}
