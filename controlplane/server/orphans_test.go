package server_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// The orphan sweep deletes the file blobs no file row holds, once they are
// older than its cutoff, and nothing else: a file's content stays (it
// still downloads through the SDK), as do objects of other folders and of
// other shapes; an orphan newer than the cutoff is left for a later sweep.
func TestOrphanedFileBlobsSwept(t *testing.T) {
	blobs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "orphans", Blobs: blobs})
	ctx := context.Background()
	c := sdkWithKey(srv.HTTPAddr(), servertest.TenantKey(t, srv, tenant.Default))
	f, err := c.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader("kept,content\n"), "kept.csv", "text/csv")})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) {
		t.Helper()
		if err := blobs.Put(ctx, key, bytes.NewReader([]byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	orphans := []string{"files/tenant_default/file_orphan1", "files/tenant_other/file_orphan2"}
	kept := []string{"files/tenant_default/odd/shape", "snapshots/sesn_x/1.tar"}
	for _, k := range append(orphans, kept...) {
		put(k)
	}

	// Newer than the cutoff: nothing goes.
	if n, err := srv.SweepOrphanBlobs(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("a sweep of nothing old enough removed %d: %v", n, err)
	}
	n, err := srv.SweepOrphanBlobs(ctx, time.Now().Add(time.Minute))
	if err != nil || n != len(orphans) {
		t.Fatalf("the sweep removed %d, want %d: %v", n, len(orphans), err)
	}
	for _, k := range orphans {
		if _, err := blobs.Get(ctx, k); !errdefs.IsNotFound(err) {
			t.Errorf("orphan %s is still there: %v", k, err)
		}
	}
	for _, k := range kept {
		rc, err := blobs.Get(ctx, k)
		if err != nil {
			t.Errorf("%s was removed: %v", k, err)
			continue
		}
		rc.Close()
	}
	resp, err := c.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "kept,content\n" {
		t.Fatalf("the file's content after the sweep: %q", b)
	}
}
