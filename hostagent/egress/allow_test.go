package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"net"
	"testing"

	"corral.dev/corral/internal/allowlist"
)

func TestAllowlist(t *testing.T) {
	a, err := ParseAllowlist([]string{"allowed.test", "*.pkg.test", "API.Example.COM."})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"allowed.test":      true,
		"ALLOWED.test.":     true,
		"sub.allowed.test":  false,
		"a.pkg.test":        true,
		"a.b.pkg.test":      true,
		"pkg.test":          false, // *.suffix is below the suffix only
		"evilpkg.test":      false,
		"api.example.com":   true,
		"example.com":       false,
		"10.0.0.1":          false,
		"":                  false,
		"allowed.test:443":  false,
		"allowed.test/path": false,
	} {
		if got := a.Allows(host); got != want {
			t.Errorf("Allows(%q) = %v, want %v", host, got, want)
		}
	}
	// "*" alone is a placement's every name (TestAnyNameAllowlist).
	for _, bad := range [][]string{{"*", "a.test"}, {"1.2.3.4"}, {"a..b"}, {"-a.test"}, {"a b"}, {"*.*.test"}, {"http://x.test"}} {
		if len(bad) == 0 {
			continue
		}
		if _, err := ParseAllowlist(bad); err == nil {
			t.Errorf("ParseAllowlist(%q) accepted", bad)
		}
	}
	if many := make([]string, MaxHosts+1); true {
		for i := range many {
			many[i] = "a.test"
		}
		if _, err := ParseAllowlist(many); err == nil {
			t.Error("an allowlist over MaxHosts was accepted")
		}
	}
}

// clientHello is the first record crypto/tls sends for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
		c.Close()
	}()
	br := bufio.NewReader(s)
	hdr, err := br.Peek(5)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := br.Peek(5 + (int(hdr[3])<<8 | int(hdr[4])))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(rec)
}

func TestPeekSNI(t *testing.T) {
	for _, name := range []string{"allowed.test", "a.very.long.name.pkg.test"} {
		rec := clientHello(t, name)
		br := bufio.NewReader(bytes.NewReader(rec))
		got, err := peekSNI(br)
		if err != nil || got != name {
			t.Errorf("peekSNI = %q, %v; want %q", got, err, name)
		}
		if br.Buffered() != len(rec) {
			t.Errorf("peekSNI consumed bytes: %d buffered of %d", br.Buffered(), len(rec))
		}
		// Every truncation is an error or no name, never a panic or a
		// wrong name.
		for i := 5; i < len(rec); i++ {
			if n, err := parseClientHello(rec[5:i]); err == nil && n != "" && n != name {
				t.Fatalf("truncated at %d: name %q", i, n)
			}
		}
	}
	if _, err := peekSNI(bufio.NewReader(bytes.NewReader([]byte("GET / HTTP/1.1\r\n\r\n")))); err != errNotTLS {
		t.Errorf("plain HTTP: %v, want errNotTLS", err)
	}
}

func FuzzParseClientHello(f *testing.F) {
	f.Add(clientHello(f, "allowed.test")[5:])
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		parseClientHello(b)
	})
}

// TestAnyNameAllowlist: a placement's [allowlist.AnyName] allows every
// valid name and still no IP literal; the pattern grammar (what an
// environment's allowed_hosts may say) refuses it, alone or among others.
func TestAnyNameAllowlist(t *testing.T) {
	a, err := ParseAllowlist([]string{allowlist.AnyName})
	if err != nil || a.Empty() {
		t.Fatalf("ParseAllowlist([*]) = %v, %v", a, err)
	}
	for host, want := range map[string]bool{"anything.example": true, "a.b.c.test": true, "10.0.0.1": false, "[::1]": false, "": false, "a b": false} {
		if got := a.Allows(host); got != want {
			t.Errorf("Allows(%q) = %v, want %v", host, got, want)
		}
	}
	for _, p := range [][]string{{"*"}, {"*", "a.test"}, {"a.test", "*"}} {
		if _, err := allowlist.Parse(p); err == nil {
			t.Errorf("allowlist.Parse(%q) accepted", p)
		}
	}
	if _, err := ParseAllowlist([]string{"*", "a.test"}); err == nil {
		t.Error("a placement's * among other names accepted")
	}
}
