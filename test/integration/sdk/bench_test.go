package sdk

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/jackc/pgx/v5"

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
