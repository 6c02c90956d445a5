// Package mirrortest serves package mirrors for tests on 127.0.0.1: a
// flat apt repository of one .deb the test builds with dpkg-deb, and a
// PEP 503 pip index of one pure-Python wheel it builds by hand. Both are
// named "localhost" in the specs it returns, as a build sandbox's egress
// proxy refuses IP literals (the host's egress must be let dial
// 127.0.0.1: --egress-allow-cidr 127.0.0.1/32).
package mirrortest

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// AptPackage installs /usr/bin/corral-hello, which prints HelloOutput.
	AptPackage  = "corral-hello"
	HelloOutput = "corral-hello from the test apt mirror"
	// PipPackage is a module whose VALUE is PipValue.
	PipPackage = "corralpkg"
	PipValue   = "corral-pip-ok"
)

// Mirrors are the served mirrors.
type Mirrors struct {
	// APT is an apt sources entry after "deb": "[trusted=yes]
	// http://localhost:PORT/ ./"; Pip an index URL.
	APT, Pip string
	debs     *atomic.Int64
	wheels   *atomic.Int64
}

// Downloads counts the fetches of the .deb and of the wheel: a build that
// was reused fetches neither again.
func (m Mirrors) Downloads() (debs, wheels int64) { return m.debs.Load(), m.wheels.Load() }

// Serve builds the .deb and its repository and the wheel and its index,
// and serves both until the test ends. Without dpkg-deb it skips, and
// under CI fails.
func Serve(t *testing.T) Mirrors {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so dpkg-deb must be here: %v", err)
		}
		t.Skipf("building the test's .deb needs dpkg-deb: %v", err)
	}
	m := Mirrors{debs: new(atomic.Int64), wheels: new(atomic.Int64)}
	repo := aptRepo(t)
	files := http.FileServer(http.Dir(repo))
	aptSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".deb") {
			m.debs.Add(1)
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(aptSrv.Close)

	wheel := Wheel(t)
	pipSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="%s/">%s</a></body></html>`, PipPackage, PipPackage)
		case "/simple/" + PipPackage + "/":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/corralpkg-1.0-py3-none-any.whl#sha256=%s">corralpkg-1.0-py3-none-any.whl</a></body></html>`, sha256Hex(wheel))
		case "/files/corralpkg-1.0-py3-none-any.whl":
			m.wheels.Add(1)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(wheel)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(pipSrv.Close)
	port := func(s *httptest.Server) uint16 { return netip.MustParseAddrPort(s.Listener.Addr().String()).Port() }
	m.APT = fmt.Sprintf("[trusted=yes] http://localhost:%d/ ./", port(aptSrv))
	m.Pip = fmt.Sprintf("http://localhost:%d/simple/", port(pipSrv))
	return m
}

// aptRepo builds the corral-hello .deb and a flat repository of it
// (Packages, and a Release listing its hash; unsigned, hence
// [trusted=yes]) in a directory.
func aptRepo(t *testing.T) string {
	t.Helper()
	write := func(p, s string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	pkg := filepath.Join(t.TempDir(), AptPackage)
	control := "Package: " + AptPackage + "\nVersion: 1.0\nArchitecture: all\nMaintainer: corral <dev@corral.invalid>\nDescription: corral's build test package\n"
	write(filepath.Join(pkg, "DEBIAN", "control"), control, 0o644)
	write(filepath.Join(pkg, "usr", "bin", AptPackage), "#!/bin/sh\necho '"+HelloOutput+"'\n", 0o755)
	repo := t.TempDir()
	deb := filepath.Join(repo, AptPackage+"_1.0_all.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, out)
	}
	debBytes, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	packages := fmt.Sprintf("%sFilename: ./%s\nSize: %d\nSHA256: %s\n\n", control, filepath.Base(deb), len(debBytes), sha256Hex(debBytes))
	write(filepath.Join(repo, "Packages"), packages, 0o644)
	release := fmt.Sprintf("Origin: corral-test\nLabel: corral-test\nDate: %s\nSHA256:\n %s %d Packages\n",
		time.Now().Add(-time.Hour).UTC().Format(time.RFC1123), sha256Hex([]byte(packages)), len(packages))
	write(filepath.Join(repo, "Release"), release, 0o644)
	return repo
}

func sha256Hex(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// Wheel makes corralpkg-1.0-py3-none-any.whl: a package whose VALUE is
// PipValue, its METADATA, WHEEL and RECORD.
func Wheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{PipPackage + "/__init__.py", fmt.Sprintf("VALUE = %q\n", PipValue)},
		{"corralpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: corralpkg\nVersion: 1.0\nSummary: corral's build test package\n"},
		{"corralpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: corral-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f.body)
		h := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(h[:]), len(f.body))
	}
	record.WriteString("corralpkg-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("corralpkg-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
