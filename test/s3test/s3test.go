// Package s3test runs a real S3-compatible server for a test: SeaweedFS's
// all-in-one `weed mini` (master, volume server, filer and S3 gateway in one
// process), built by scripts/runtime/s3.sh, on loopback ports of its own,
// with one bucket and one key pair. It is what corral's S3 blob store is
// tested against besides the in-process fake, which passes the same suite.
//
// On a machine without the binary a test skips and says why; under CI,
// where `make test` builds it, it fails instead.
package s3test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"corral.dev/corral/internal/freeport"
	"corral.dev/corral/internal/waitfor"
)

// DefaultBinary is where scripts/runtime/s3.sh links the weed binary.
const DefaultBinary = "/var/cache/corral/bin/weed"

// Bucket is the bucket every server starts with.
const Bucket = "corral"

// Server is a running S3 server.
type Server struct {
	// Endpoint is host:port of its S3 API (plain HTTP, on loopback).
	Endpoint  string
	AccessKey string
	SecretKey string
	// Dir holds its data.
	Dir string
}

// Client is a plain S3 client of the server: the raw baseline of
// benchmarks, and a way to look behind corral's back in tests.
func (s *Server) Client(tb testing.TB) *minio.Client {
	tb.Helper()
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region:       "us-east-1",
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// binary is the weed binary tests use: CORRAL_WEED, or DefaultBinary.
func binary(tb testing.TB) string {
	tb.Helper()
	bin := os.Getenv("CORRAL_WEED")
	if bin == "" {
		bin = DefaultBinary
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("CI is set, so the S3 server must be here (make test builds it: scripts/runtime/s3.sh): %v", err)
		}
		tb.Skipf("no S3 server binary at %s (scripts/runtime/s3.sh builds it): %v", bin, err)
	}
	return bin
}

// startTimeout bounds how long the server may take to come up: it starts
// five components, slow on a busy 2-core machine.
const startTimeout = 90 * time.Second

// Start starts a server for the test and stops it (and removes its data)
// when the test ends. It returns once the bucket answers.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := binary(tb)
	dir := tb.TempDir()
	s := &Server{AccessKey: "corral-test", SecretKey: "corral-test-secret-" + strconv.FormatInt(time.Now().UnixNano(), 36), Dir: dir}
	identities := fmt.Sprintf(`{"identities":[{"name":"corral","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","Write","List","Tagging"]}]}`,
		s.AccessKey, s.SecretKey)
	config := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(config, []byte(identities), 0o600); err != nil {
		tb.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		tb.Fatal(err)
	}
	// Every listener gets a port of its own: weed's defaults (9333, 8333,
	// and each port + 10000 for gRPC) would collide between tests and with
	// anything else on the machine.
	port := func() string {
		p, err := freeport.Port("127.0.0.1")
		if err != nil {
			tb.Fatal(err)
		}
		return strconv.Itoa(p)
	}
	s3Port := port()
	s.Endpoint = "127.0.0.1:" + s3Port
	args := []string{"mini", "-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + port(), "-master.port.grpc=" + port(), "-master.telemetry=false", "-master.volumeSizeLimitMB=64",
		"-volume.port=" + port(), "-volume.port.grpc=" + port(),
		"-filer.port=" + port(), "-filer.port.grpc=" + port(),
		"-s3.port=" + s3Port, "-s3.port.grpc=" + port(), "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.config=" + config,
		"-admin.ui=false", "-admin.port=" + port(), "-admin.port.grpc=" + port(), "-admin.port.legacy=0",
		"-webdav=false", "-bucket=" + Bucket}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// Its own process group, so that the cleanup ends whatever it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	logPath := filepath.Join(dir, "weed.log")
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		// The banner weed prints once every component is up is the
		// signal; the log is kept for a failure's message.
		sc := bufio.NewScanner(io.TeeReader(out, logf))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "All enabled components are running") {
				signalled = true
				close(ready)
			}
		}
		_, _ = io.Copy(logf, out)
		exited <- cmd.Wait()
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		logf.Close()
	}
	tb.Cleanup(stop)
	tail := func() string {
		b, _ := os.ReadFile(logPath)
		if len(b) > 4<<10 {
			b = b[len(b)-4<<10:]
		}
		return string(b)
	}
	select {
	case <-ready:
	case err := <-exited:
		exited <- err
		tb.Fatalf("the S3 server exited before it was ready: %v\n%s", err, tail())
	case <-time.After(startTimeout):
		tb.Fatalf("the S3 server was not ready after %v\n%s", startTimeout, tail())
	}
	// The banner comes when the components listen; the bucket is made by
	// the filer a moment later. Ask for it, bounded.
	c := s.Client(tb)
	waitfor.State(tb, 30*time.Second, "the S3 server's bucket "+Bucket, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ok, err := c.BucketExists(ctx, Bucket)
		return ok && err == nil, fmt.Sprintf("exists %v, %v\n%s", ok, err, tail())
	})
	return s
}
