package sdk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/store/pgtest"
)

// BenchmarkSessionCreate creates sessions through the official SDK against
// one node, and reports p50/p99 latency next to BenchmarkRawSessionInsert,
// the same row written with one raw INSERT + NOTIFY in the same run.
func BenchmarkSessionCreate(b *testing.B) {
	client := setup(b)
	ctx := context.Background()
	agent, err := client.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "bench", Model: anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}})
	if err != nil {
		b.Fatal(err)
	}
	env, err := client.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := client.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{
			Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(agent.ID)}, EnvironmentID: env.ID,
		}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

// BenchmarkRawSessionInsert is BenchmarkSessionCreate's baseline: one INSERT
// of a session row and a NOTIFY, in one transaction, over one connection.
func BenchmarkRawSessionInsert(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range []string{
		`INSERT INTO agents (tenant_id, id, latest_version) VALUES ('tenant_default', 'agent_b', 1)`,
		`INSERT INTO agent_versions (tenant_id, agent_id, version, name, spec) VALUES ('tenant_default', 'agent_b', 1, 'b', '{}')`,
		`INSERT INTO environments (tenant_id, id, name, config) VALUES ('tenant_default', 'env_b', 'b', '{}')`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO sessions (tenant_id, id, agent_id, agent_version, agent, environment_id)
				VALUES ('tenant_default', $1, 'agent_b', 1, '{"id":"agent_b"}', 'env_b')`, fmt.Sprintf("sesn_%d", i)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_notify('raw_bench', 'x')`)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

// benchFileSize is the file BenchmarkFileUpload and BenchmarkFileDownload
// move: large enough that the request overhead is small beside it.
const benchFileSize = 32 << 20

// BenchmarkFileUpload uploads a file through the official SDK (which
// builds the whole multipart body in memory first) to one node keeping its
// blobs in a local directory; BenchmarkRawBlobPut is the same bytes
// written to the same kind of store directly.
func BenchmarkFileUpload(b *testing.B) {
	client := setup(b)
	ctx := context.Background()
	data := make([]byte, benchFileSize)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
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
}

// BenchmarkFileDownload downloads the file of BenchmarkFileUpload.
func BenchmarkFileDownload(b *testing.B) {
	client := setup(b)
	ctx := context.Background()
	f, err := client.Beta.Files.Upload(ctx, anthropic.BetaFileUploadParams{File: anthropic.File(bytes.NewReader(make([]byte, benchFileSize)), "bench.bin", "")})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchFileSize)
	b.ResetTimer()
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
}

// BenchmarkRawBlobPut is BenchmarkFileUpload's baseline: the same bytes
// put into a blob.Dir, no HTTP, no multipart, no database.
func BenchmarkRawBlobPut(b *testing.B) {
	d, err := blob.NewDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, benchFileSize)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Put(context.Background(), fmt.Sprintf("files/t/%d", i), bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
