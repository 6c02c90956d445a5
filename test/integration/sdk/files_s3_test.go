package sdk

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/minio/minio-go/v7"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/test/s3test"
)

// s3Node starts a node whose blobs are kept in a real S3 server
// (test/s3test) under the prefix "blobs/", and returns a client of the
// default tenant and the server.
func s3Node(tb testing.TB, fileLimit int64) (anthropic.Client, *s3test.Server) {
	tb.Helper()
	s3 := s3test.Start(tb)
	blobs, err := blob.NewS3(blob.S3Config{Endpoint: s3.Endpoint, Bucket: s3test.Bucket, Prefix: "blobs",
		AccessKey: s3.AccessKey, SecretKey: logging.Secret(s3.SecretKey), Region: "us-east-1", PathStyle: true, Insecure: true})
	if err != nil {
		tb.Fatal(err)
	}
	srv := servertest.Start(tb, pgtest.New(tb), server.Config{NodeID: "sdk-files-s3", FileMaxBytes: fileLimit, Blobs: blobs})
	return anthropic.NewClient(
		option.WithBaseURL("http://"+srv.HTTPAddr()),
		option.WithAPIKey(servertest.TenantKey(tb, srv, tenant.Default)),
		option.WithRequestTimeout(60*time.Second),
	), s3
}

// The Files API on a real S3 server: a file uploaded through the SDK is
// one object in the bucket under files/<tenant>/<id>, downloads byte for
// byte, and its delete removes the object.
func TestFilesOnS3(t *testing.T) {
	client, s3 := s3Node(t, 64<<20)
	ctx := context.Background()
	data := make([]byte, 20<<20+12345) // more than one part of an upload of unknown length
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	f, err := client.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(data), "data.bin", "application/octet-stream")})
	if err != nil {
		t.Fatalf("Files.Upload: %v", err)
	}
	if f.SizeBytes != int64(len(data)) {
		t.Fatalf("uploaded size %d, want %d", f.SizeBytes, len(data))
	}
	raw := s3.Client(t)
	key := "blobs/files/" + string(tenant.Default) + "/" + f.ID
	objects := func() []string {
		var keys []string
		for obj := range raw.ListObjects(ctx, s3test.Bucket, minio.ListObjectsOptions{Prefix: "blobs/", Recursive: true}) {
			if obj.Err != nil {
				t.Fatal(obj.Err)
			}
			keys = append(keys, obj.Key)
		}
		return keys
	}
	if keys := objects(); len(keys) != 1 || keys[0] != key {
		t.Fatalf("objects in the bucket: %v, want [%s]", keys, key)
	}
	st, err := raw.StatObject(ctx, s3test.Bucket, key, minio.StatObjectOptions{})
	if err != nil || st.Size != int64(len(data)) {
		t.Fatalf("the object: %d bytes, %v; want %d", st.Size, err, len(data))
	}

	resp, err := client.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
	if err != nil {
		t.Fatalf("Files.Download: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes (%v), want the %d uploaded", len(got), err, len(data))
	}

	// Over the limit: refused, and no object is left behind.
	_, err = client.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(make([]byte, 64<<20+1)), "big.bin", "")})
	apiError(t, err, 413)
	if keys := objects(); len(keys) != 1 {
		t.Fatalf("after a refused upload the bucket holds %v", keys)
	}

	if _, err := client.Beta.Files.Delete(ctx, f.ID, anthropic.BetaFileDeleteParams{}); err != nil {
		t.Fatalf("Files.Delete: %v", err)
	}
	if keys := objects(); len(keys) != 0 {
		t.Fatalf("after the delete the bucket holds %v", keys)
	}
	_, err = client.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
	if e := apiError(t, err, 404); strings.Contains(e.Error(), s3.Endpoint) {
		t.Fatalf("a tenant's error names the blob store: %v", e)
	}
}

// BenchmarkFilesOnS3: upload and download of a file through the official
// SDK to a node keeping its blobs in a real S3 server, each beside its raw
// baseline in the same run: the same bytes put to and got from the same
// bucket with a plain S3 client (minio-go), no corral in between.
func BenchmarkFilesOnS3(b *testing.B) {
	client, s3 := s3Node(b, 2*benchFileSize)
	raw := s3.Client(b)
	ctx := context.Background()
	data := make([]byte, benchFileSize)
	b.Run("upload", func(b *testing.B) {
		b.SetBytes(benchFileSize)
		for i := 0; i < b.N; i++ {
			f, err := client.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(data), "bench.bin", "")})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if _, err := client.Beta.Files.Delete(ctx, f.ID, anthropic.BetaFileDeleteParams{}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("raw-put", func(b *testing.B) {
		b.SetBytes(benchFileSize)
		for i := 0; i < b.N; i++ {
			// Unknown length, as corral's store streams an upload.
			if _, err := raw.PutObject(ctx, s3test.Bucket, "raw/bench", bytes.NewReader(data), -1, minio.PutObjectOptions{PartSize: 16 << 20}); err != nil {
				b.Fatal(err)
			}
		}
	})
	f, err := client.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(data), "bench.bin", "")})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("download", func(b *testing.B) {
		b.SetBytes(benchFileSize)
		for i := 0; i < b.N; i++ {
			resp, err := client.Beta.Files.Download(ctx, f.ID, anthropic.BetaFileDownloadParams{})
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || n != benchFileSize {
				b.Fatalf("downloaded %d bytes: %v", n, err)
			}
		}
	})
	b.Run("raw-get", func(b *testing.B) {
		// Its own object, so that it runs on its own too (-bench .../raw-get).
		if _, err := raw.PutObject(ctx, s3test.Bucket, "raw/get", bytes.NewReader(data), benchFileSize, minio.PutObjectOptions{}); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchFileSize)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			obj, err := raw.GetObject(ctx, s3test.Bucket, "raw/get", minio.GetObjectOptions{})
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, obj)
			obj.Close()
			if err != nil || n != benchFileSize {
				b.Fatalf("got %d bytes: %v", n, err)
			}
		}
	})
}
