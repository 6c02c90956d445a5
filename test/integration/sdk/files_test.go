package sdk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
)

// fileLimit is the node's file size limit in these tests.
const fileLimit = 1 << 20

// The Files API through the official SDK (Beta.Files): a CSV uploads,
// lists, reads back as metadata and byte for byte as content, and
// deletes; a file over the limit is a 413; another tenant sees nothing.
func TestFilesThroughTheSDK(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-files", FileMaxBytes: fileLimit})
	client := func(id tenant.ID) anthropic.Client {
		return anthropic.NewClient(
			option.WithBaseURL("http://"+srv.HTTPAddr()),
			option.WithAPIKey(servertest.TenantKey(t, srv, id)),
			option.WithRequestTimeout(30*time.Second),
		)
	}
	a, b := client(tenant.Default), client("tenant_b")
	ctx := context.Background()

	var csv bytes.Buffer
	csv.WriteString("id,name,score\n")
	for i := 0; csv.Len() < 200<<10; i++ {
		fmt.Fprintf(&csv, "%d,user-%d,%d\n", i, i*7919%10007, i%100)
	}
	start := time.Now()
	f, err := a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(csv.Bytes()), "scores.csv", "text/csv")})
	if err != nil {
		t.Fatalf("Files.Upload: %v", err)
	}
	t.Logf("uploaded %d bytes in %v", csv.Len(), time.Since(start))
	decodedCleanly(t, "Files.Upload", f)
	if !strings.HasPrefix(f.ID, "file_") || f.Type != "file" || f.Filename != "scores.csv" || f.MimeType != "text/csv" ||
		f.SizeBytes != int64(csv.Len()) || !f.Downloadable || f.CreatedAt.IsZero() || f.JSON.Scope.Raw() != "null" || f.JSON.ExpiresAt.Raw() != "null" {
		t.Fatalf("uploaded = %s", f.RawJSON())
	}

	// A second file, so the listing pages.
	if _, err := a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader("x"), "x.txt", "")}); err != nil {
		t.Fatalf("Files.Upload: %v", err)
	}
	page, err := a.Beta.Files.List(ctx, anthropic.BetaFileListParams{Limit: anthropic.Int(1)})
	if err != nil || len(page.Data) != 1 || page.Data[0].Filename != "x.txt" || page.NextPage == "" {
		t.Fatalf("Files.List: %+v, %v", page, err)
	}
	var listed []string
	for it := a.Beta.Files.ListAutoPaging(ctx, anthropic.BetaFileListParams{Limit: anthropic.Int(1)}); it.Next(); {
		decodedCleanly(t, "Files.List", it.Current())
		listed = append(listed, it.Current().ID)
	}
	if len(listed) != 2 || listed[1] != f.ID {
		t.Fatalf("listed %v; want two, %s the older", listed, f.ID)
	}

	got, err := a.Beta.Files.GetMetadata(ctx, f.ID, anthropic.BetaFileGetMetadataParams{})
	if err != nil || got.RawJSON() != f.RawJSON() {
		t.Fatalf("Files.GetMetadata: %v\n%s\nwant\n%s", err, got.RawJSON(), f.RawJSON())
	}
	decodedCleanly(t, "Files.GetMetadata", got)

	start = time.Now()
	resp, err := a.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
	if err != nil {
		t.Fatalf("Files.Download: %v", err)
	}
	content, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(content, csv.Bytes()) {
		t.Fatalf("downloaded %d bytes (%v), want the %d uploaded", len(content), err, csv.Len())
	}
	t.Logf("downloaded %d bytes in %v", len(content), time.Since(start))
	if ct, cl := resp.Header.Get("Content-Type"), resp.Header.Get("Content-Length"); ct != "text/csv" || cl != fmt.Sprint(csv.Len()) {
		t.Fatalf("download headers: Content-Type %q, Content-Length %q", ct, cl)
	}

	// Another tenant sees none of it.
	if l, err := b.Beta.Files.List(ctx, anthropic.BetaFileListParams{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("tenant B lists %+v, %v", l, err)
	}
	_, err = b.Beta.Files.GetMetadata(ctx, f.ID, anthropic.BetaFileGetMetadataParams{})
	apiError(t, err, 404)
	_, err = b.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
	apiError(t, err, 404)
	_, err = b.Beta.Files.Delete(ctx, f.ID, anthropic.BetaFileDeleteParams{})
	apiError(t, err, 404)

	// Over the limit: refused, and nothing is kept.
	_, err = a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(make([]byte, fileLimit+1)), "big.bin", "")})
	if e := apiError(t, err, 413); !strings.Contains(e.Error(), fmt.Sprintf("larger than the limit of %d bytes", fileLimit)) {
		t.Fatalf("over the limit: %v", e)
	}
	// A filename that is a path is refused.
	_, err = a.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(strings.NewReader("x"), "../etc/passwd", "")})
	apiError(t, err, 400)

	del, err := a.Beta.Files.Delete(ctx, f.ID, anthropic.BetaFileDeleteParams{})
	if err != nil || del.ID != f.ID || del.Type != "file_deleted" {
		t.Fatalf("Files.Delete: %+v, %v", del, err)
	}
	decodedCleanly(t, "Files.Delete", del)
	_, err = a.Beta.Files.GetMetadata(ctx, f.ID, anthropic.BetaFileGetMetadataParams{})
	apiError(t, err, 404)
	_, err = a.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
	apiError(t, err, 404)
	if l, err := a.Beta.Files.List(ctx, anthropic.BetaFileListParams{}); err != nil || len(l.Data) != 1 {
		t.Fatalf("after the delete: %+v, %v", l, err)
	}
}
