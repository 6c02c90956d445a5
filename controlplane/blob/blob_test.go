package blob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/test/s3test"
)

// storeSuite is what every Store must do.
func storeSuite(t *testing.T, s blob.Store) {
	ctx := context.Background()
	if _, err := s.Get(ctx, "a/missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	data := bytes.Repeat([]byte("x"), 3<<20)
	if err := s.Put(ctx, "drain/s1/w.tar", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "drain/s1/w.tar", bytes.NewReader(data[:10])); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "drain/s1/w.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data[:10]) {
		t.Fatalf("get after replace: %d bytes, %v", len(got), err)
	}
	if err := s.Delete(ctx, "drain/s1/w.tar"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "drain/s1/w.tar"); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := s.Get(ctx, "drain/s1/w.tar"); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
	// DeletePrefix removes a folder's objects and nothing beside it.
	for _, k := range []string{"snap/s1/1.tar", "snap/s1/2.tar", "snap/s1x/1.tar", "snap/s2/1.tar"} {
		if err := s.Put(ctx, k, bytes.NewReader(data[:3])); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeletePrefix(ctx, "snap/s1"); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]bool{"snap/s1/1.tar": false, "snap/s1/2.tar": false, "snap/s1x/1.tar": true, "snap/s2/1.tar": true} {
		rc, err := s.Get(ctx, k)
		if err == nil {
			rc.Close()
		}
		if got := err == nil; got != want {
			t.Errorf("after DeletePrefix(snap/s1): %s present = %v, want %v (%v)", k, got, want, err)
		}
	}
	if err := s.DeletePrefix(ctx, "snap/none"); err != nil {
		t.Errorf("DeletePrefix of an empty folder: %v", err)
	}
	// List: a folder's objects, with their sizes, and nothing beside it;
	// an empty folder lists nothing; fn's error stops it.
	for _, k := range []string{"list/a/1", "list/a/b/2", "list/ab/3"} {
		if err := s.Put(ctx, k, bytes.NewReader(data[:len(k)])); err != nil {
			t.Fatal(err)
		}
	}
	listed := map[string]int64{}
	if err := s.List(ctx, "list/a", func(o blob.Object) error {
		if o.Modified.IsZero() {
			t.Errorf("%s: no modification time", o.Key)
		}
		listed[o.Key] = o.Size
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 2 || listed["list/a/1"] != int64(len("list/a/1")) || listed["list/a/b/2"] != int64(len("list/a/b/2")) {
		t.Errorf("List(list/a) = %v", listed)
	}
	stop := errors.New("enough")
	n := 0
	if err := s.List(ctx, "list", func(blob.Object) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Errorf("List stopped by fn: %v after %d", err, n)
	}
	if err := s.List(ctx, "list/none", func(o blob.Object) error { return fmt.Errorf("listed %s", o.Key) }); err != nil {
		t.Errorf("List of an empty folder: %v", err)
	}
	if err := s.List(ctx, "../up", func(blob.Object) error { return nil }); !errdefs.IsInvalidArgument(err) {
		t.Errorf("List(../up): %v", err)
	}
	for _, bad := range []string{"", "/abs", "../up", "a/../b", "a//b", "a b", "trailing/"} {
		if err := s.Put(ctx, bad, bytes.NewReader(nil)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("put %q: %v, want invalid argument", bad, err)
		}
	}
	// A failed put leaves nothing behind.
	if err := s.Put(ctx, "half", io.MultiReader(bytes.NewReader(data[:5]), errReader{})); err == nil {
		t.Fatal("put from a failing reader succeeded")
	}
	if _, err := s.Get(ctx, "half"); !errdefs.IsNotFound(err) {
		t.Fatalf("half-written object visible: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestDir(t *testing.T) {
	root := t.TempDir()
	s, err := blob.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	storeSuite(t, s)
	left, _ := filepath.Glob(filepath.Join(root, "*", ".put-*"))
	if entries, _ := os.ReadDir(root); len(left) > 0 {
		t.Fatalf("temporary files left: %v (%d entries)", left, len(entries))
	}
	if _, err := blob.NewDir("relative"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("relative root: %v", err)
	}
}

// TestS3 runs the suite against an in-process S3-compatible server, the
// fake that unit tests elsewhere may use: it must pass the suite the real
// server passes (TestS3Server).
func TestS3(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("corral"); err != nil {
		t.Fatal(err)
	}
	// Over TLS, as in production (the fake does not decode the chunked
	// signed uploads a client sends over plain HTTP).
	srv := httptest.NewTLSServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	s, err := blob.NewS3(blob.S3Config{Endpoint: strings.TrimPrefix(srv.URL, "https://"), Bucket: "corral", Prefix: "drain",
		AccessKey: "key", SecretKey: "secret", Region: "us-east-1", PathStyle: true, Transport: srv.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	storeSuite(t, s)
	if _, err := blob.NewS3(blob.S3Config{Bucket: "corral"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("no endpoint: %v", err)
	}
}

// TestS3Server runs the suite against a real S3-compatible server
// (SeaweedFS, test/s3test), over plain HTTP on loopback: the client then
// signs each chunk of an upload (aws-chunked), which the fake cannot read.
func TestS3Server(t *testing.T) {
	srv := s3test.Start(t)
	s, err := blob.NewS3(blob.S3Config{Endpoint: srv.Endpoint, Bucket: s3test.Bucket, Prefix: "corral",
		AccessKey: srv.AccessKey, SecretKey: logging.Secret(srv.SecretKey), Region: "us-east-1", PathStyle: true, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	storeSuite(t, s)
	// An upload of unknown length larger than a part goes up in parts.
	big := bytes.Repeat([]byte("0123456789abcdef"), (40<<20)/16)
	if err := s.Put(context.Background(), "big/one", io.MultiReader(bytes.NewReader(big))); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(context.Background(), "big/one")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("a 40 MiB object read back as %d bytes (%v)", len(got), err)
	}
	// Everything the store wrote is under its prefix, as the server lists it.
	for obj := range srv.Client(t).ListObjects(context.Background(), s3test.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		if !strings.HasPrefix(obj.Key, "corral/") {
			t.Errorf("object %q outside the store's prefix", obj.Key)
		}
	}
	// A wrong secret is refused, not taken for a missing object.
	bad, err := blob.NewS3(blob.S3Config{Endpoint: srv.Endpoint, Bucket: s3test.Bucket, AccessKey: srv.AccessKey, SecretKey: "wrong",
		Region: "us-east-1", PathStyle: true, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Get(context.Background(), "big/one"); err == nil || errdefs.IsNotFound(err) {
		t.Fatalf("get with a wrong secret: %v, want a refusal", err)
	}
}
