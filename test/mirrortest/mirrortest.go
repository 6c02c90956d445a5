// Package mirrortest serves package mirrors for tests on 127.0.0.1: a
// flat apt repository of one .deb the test builds with dpkg-deb, a PEP
// 503 pip index of one pure-Python wheel it builds by hand, and an npm
// registry of one package (its packument and tarball, made by hand). Both are
// named "localhost" in the specs it returns, as a build sandbox's egress
// proxy refuses IP literals (the host's egress must be let dial
// 127.0.0.1: --egress-allow-cidr 127.0.0.1/32).
package mirrortest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	// NpmPackage installs the command corral-npm-hello (node), which
	// prints NpmOutput.
	NpmPackage = "corral-npm-hello"
	NpmOutput  = "corral-npm-hello from the test npm registry"
)

// Mirrors are the served mirrors.
type Mirrors struct {
	// APT is an apt sources entry after "deb": "[trusted=yes]
	// http://localhost:PORT/ ./"; Pip an index URL; Npm a registry URL.
	APT, Pip, Npm string
	debs, wheels  *atomic.Int64
	tarballs      *atomic.Int64
}

// Downloads counts the fetches of the .deb and of the wheel: a build that
// was reused fetches neither again.
func (m Mirrors) Downloads() (debs, wheels int64) { return m.debs.Load(), m.wheels.Load() }

// NpmDownloads counts the fetches of the npm package's tarball.
func (m Mirrors) NpmDownloads() int64 { return m.tarballs.Load() }

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
	m := Mirrors{debs: new(atomic.Int64), wheels: new(atomic.Int64), tarballs: new(atomic.Int64)}
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
	tgz := NpmTarball(t)
	var npmURL string
	npmSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/" + NpmPackage:
			// The packument: the package's versions, each with its
			// tarball's address and sums.
			sha1sum := sha1.Sum(tgz)
			sha512sum := sha512.Sum512(tgz)
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{
				"name": NpmPackage, "dist-tags": map[string]string{"latest": "1.0.0"},
				"versions": map[string]any{"1.0.0": map[string]any{
					"name": NpmPackage, "version": "1.0.0", "bin": map[string]string{NpmPackage: "bin.js"},
					"dist": map[string]string{
						"tarball":   npmURL + NpmPackage + "/-/" + NpmPackage + "-1.0.0.tgz",
						"shasum":    hex.EncodeToString(sha1sum[:]),
						"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
					},
				}},
			})
		case "/" + NpmPackage + "/-/" + NpmPackage + "-1.0.0.tgz":
			m.tarballs.Add(1)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(tgz)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(npmSrv.Close)
	port := func(s *httptest.Server) uint16 { return netip.MustParseAddrPort(s.Listener.Addr().String()).Port() }
	m.APT = fmt.Sprintf("[trusted=yes] http://localhost:%d/ ./", port(aptSrv))
	m.Pip = fmt.Sprintf("http://localhost:%d/simple/", port(pipSrv))
	m.Npm = fmt.Sprintf("http://localhost:%d/", port(npmSrv))
	npmURL = m.Npm
	return m
}

// NpmTarball makes corral-npm-hello-1.0.0.tgz: package/package.json and
// package/bin.js, a node script printing NpmOutput.
func NpmTarball(t *testing.T) []byte {
	t.Helper()
	pkgJSON, _ := json.Marshal(map[string]any{"name": NpmPackage, "version": "1.0.0", "bin": map[string]string{NpmPackage: "bin.js"}})
	files := []struct {
		name, body string
		mode       int64
	}{
		{"package/package.json", string(pkgJSON), 0o644},
		{"package/bin.js", "#!/usr/bin/env node\nconsole.log(" + strconv.Quote(NpmOutput) + ")\n", 0o755},
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
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
