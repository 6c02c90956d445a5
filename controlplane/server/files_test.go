package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Deleting a tenant deletes its files' content from the blob store along
// with their rows; another tenant's files stay.
func TestDeleteTenantDeletesItsFiles(t *testing.T) {
	db := pgtest.New(t)
	blobDir := t.TempDir()
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", BlobDir: blobDir})
	upload := func(id tenant.ID) string {
		c := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, id)),
			option.WithRequestTimeout(30*time.Second))
		f, err := c.Beta.Files.Upload(context.Background(), anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader("a,b\n"), "t.csv", "text/csv")})
		if err != nil {
			t.Fatalf("upload as %s: %v", id, err)
		}
		return f.ID
	}
	gone, stay := upload("tenant_gone"), upload(tenant.Default)
	if got := blobFiles(t, blobDir); len(got) != 2 {
		t.Fatalf("blobs = %v", got)
	}
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	if _, err := admin.DeleteTenant(context.Background(), &adminv1.DeleteTenantRequest{TenantId: "tenant_gone"}); err != nil {
		t.Fatalf("DeleteTenant: %v", err)
	}
	got := blobFiles(t, blobDir)
	if len(got) != 1 || got[0] != "files/tenant_default/"+stay || strings.Contains(strings.Join(got, " "), gone) {
		t.Fatalf("blobs after the delete = %v; want only %s", got, stay)
	}
	if n := db.TenantRows(t, "tenant_gone"); n != 0 {
		t.Fatalf("%d rows of the deleted tenant remain", n)
	}
}

func blobFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, "files"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An upload streams: a 100 MiB file through a node allocates a small
// fraction of its size, and its content downloads back whole.
func TestUploadStreams(t *testing.T) {
	db := pgtest.New(t)
	blobDir := t.TempDir()
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", BlobDir: blobDir})
	key := servertest.TenantKey(t, srv, tenant.Default)
	const size = 100 << 20
	const boundary = "corral-test-boundary"
	head := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
	tail := "\r\n--" + boundary + "--\r\n"
	body := io.MultiReader(strings.NewReader(head), &zeros{left: size}, strings.NewReader(tail))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	req, err := http.NewRequest("POST", "http://"+srv.HTTPAddr()+"/v1/files", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(head) + size + len(tail))
	req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
	req.Header.Set("x-api-key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	var f struct {
		ID        string `json:"id"`
		SizeBytes int64  `json:"size_bytes"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &f) != nil || f.SizeBytes != size {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	grew := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d MiB upload allocated %d MiB", size>>20, grew>>20)
	if grew > 16<<20 {
		t.Errorf("a %d MiB upload allocated %d MiB: it is not streamed", size>>20, grew>>20)
	}
	if got := blobFiles(t, blobDir); len(got) != 1 {
		t.Fatalf("blobs = %v", got)
	}
	st, err := os.Stat(filepath.Join(blobDir, "files", "tenant_default", f.ID))
	if err != nil || st.Size() != size {
		t.Fatalf("stored content: %v, %v", st, err)
	}
}

// A tenant's own file_storage_mib (SetQuota) bounds its files on the next
// upload, through the SDK: over it, a 429 naming the quota; the default
// (10 GiB) is reported until then, and another tenant keeps it.
func TestFileStorageQuotaOverride(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", BlobDir: t.TempDir()})
	ctx := context.Background()
	c := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, "tenant_a")),
		option.WithRequestTimeout(30*time.Second))
	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	q, err := admin.GetQuota(ctx, &adminv1.GetQuotaRequest{TenantId: "tenant_a"})
	if err != nil || q.Effective.FileStorageMib != 10240 || q.Overrides.FileStorageMib != nil {
		t.Fatalf("GetQuota = %v, %v; want 10240 MiB by default", q, err)
	}
	one := int32(1)
	set, err := admin.SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: "tenant_a", Overrides: &adminv1.QuotaOverride{FileStorageMib: &one}})
	if err != nil || set.Effective.FileStorageMib != 1 || set.Overrides.GetFileStorageMib() != 1 {
		t.Fatalf("SetQuota = %v, %v", set, err)
	}
	upload := func(size int) error {
		_, err := c.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader(strings.Repeat("x", size)), "f.bin", "")})
		return err
	}
	if err := upload(600 << 10); err != nil {
		t.Fatalf("600 KiB under a 1 MiB quota: %v", err)
	}
	err = upload(600 << 10)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || !strings.Contains(err.Error(), "quota file_storage_mib exceeded") {
		t.Fatalf("1200 KiB under a 1 MiB quota: %v", err)
	}
	if err := upload(400 << 10); err != nil {
		t.Fatalf("what still fits: %v", err)
	}
	zero := int32(0)
	if _, err := admin.SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: "tenant_a", Overrides: &adminv1.QuotaOverride{FileStorageMib: &zero}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a zero file_storage_mib: %v", err)
	}
}
