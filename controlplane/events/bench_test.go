package events_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/store"
)

// The benchmarks measure the event path end to end on one node with
// PostgreSQL, next to a raw baseline measured in the same run:
//
//	BenchmarkRawInsertNotify   INSERT + NOTIFY in one transaction, received on a LISTEN connection
//	BenchmarkAppendToSSE       client event appended through the store, received as an SSE frame
//	BenchmarkAppendToSSE1000   the same with 1,000 streams open on the node
//
// Each reports p50 and p99 latency (ms) and throughput (events/s). Compare
// the ratios, not the absolute numbers: these machines are noisy.

func reportLatencies(b *testing.B, lat []time.Duration, elapsed time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "events/s")
}

func BenchmarkRawInsertNotify(b *testing.B) {
	h := newHarness(b)
	c := context.Background()
	conn, err := pgx.Connect(c, h.db.OwnerURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(c)
	if _, err := conn.Exec(c, `CREATE TABLE raw_events (seq bigserial PRIMARY KEY, session_id text, body jsonb)`); err != nil {
		b.Fatal(err)
	}
	listener, err := pgx.Connect(c, h.db.OwnerURL)
	if err != nil {
		b.Fatal(err)
	}
	defer listener.Close(c)
	if _, err := listener.Exec(c, `LISTEN raw_bench`); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		tx, err := conn.Begin(c)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Exec(c, `INSERT INTO raw_events (session_id, body) VALUES ('s', '{"type":"user.message","content":[]}')`); err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Exec(c, `SELECT pg_notify('raw_bench', 's:1')`); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(c); err != nil {
			b.Fatal(err)
		}
		if _, err := listener.WaitForNotification(c); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatencies(b, lat, time.Since(start))
}

func benchAppendToSSE(b *testing.B, extraStreams int) {
	h := newHarness(b)
	n := startNode(b, h.st)
	sid := h.createSession(b, agentloop.Agent{})

	// Idle streams on other sessions load the hub like a busy node.
	var idle []*http.Response
	if extraStreams > 0 {
		others := make([]string, extraStreams)
		for i := range others {
			others[i] = h.createSession(b, agentloop.Agent{})
		}
		for _, o := range others {
			resp, err := http.Get(n.srv.URL + "/v1/sessions/" + o + "/events/stream")
			if err != nil {
				b.Fatal(err)
			}
			idle = append(idle, resp)
		}
		defer func() {
			for _, r := range idle {
				r.Body.Close()
			}
		}()
	}

	resp, err := http.Get(n.srv.URL + "/v1/sessions/" + sid + "/events/stream")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	got := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "id: ") {
				got <- line[4:]
			}
		}
		close(got)
	}()

	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("sevt_bench_%d", i)
		t0 := time.Now()
		// Interrupts on an idle session are consumed without a model call,
		// so the loop adds little; the path measured is append → NOTIFY →
		// hub → stream → read back → SSE frame.
		_, err := h.st.Events().AppendClient(ctx, sid, []store.NewEvent{{ID: id, Type: "user.interrupt", Body: []byte(`{"id":"` + id + `","type":"user.interrupt"}`)}})
		if err != nil {
			b.Fatal(err)
		}
		for seen := range got {
			if seen == id {
				break
			}
		}
		lat = append(lat, time.Since(t0))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	reportLatencies(b, lat, elapsed)
}

func BenchmarkAppendToSSE(b *testing.B) { benchAppendToSSE(b, 0) }

func BenchmarkAppendToSSE1000(b *testing.B) { benchAppendToSSE(b, 1000) }

// BenchmarkSustainedAppend measures append throughput with several writers,
// against the same shape of raw INSERT + NOTIFY.
func BenchmarkSustainedAppend(b *testing.B) {
	h := newHarness(b)
	const writers = 8
	sids := make([]string, writers)
	for i := range sids {
		sids[i] = h.createSession(b, agentloop.Agent{})
	}
	var wg sync.WaitGroup
	per := b.N/writers + 1
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				id := fmt.Sprintf("sevt_s_%d_%d", w, i)
				_, err := h.st.Events().AppendClient(ctx, sids[w], []store.NewEvent{{ID: id, Type: "user.interrupt", Body: []byte(`{"type":"user.interrupt"}`)}})
				if err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	b.ReportMetric(float64(per*writers)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkSustainedRawInsertNotify is the baseline of BenchmarkSustainedAppend.
func BenchmarkSustainedRawInsertNotify(b *testing.B) {
	h := newHarness(b)
	c := context.Background()
	owner, err := pgx.Connect(c, h.db.OwnerURL)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := owner.Exec(c, `CREATE TABLE raw_events (seq bigserial PRIMARY KEY, session_id text, body jsonb)`); err != nil {
		b.Fatal(err)
	}
	owner.Close(c)
	const writers = 8
	var wg sync.WaitGroup
	per := b.N/writers + 1
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			conn, err := pgx.Connect(c, h.db.OwnerURL)
			if err != nil {
				b.Error(err)
				return
			}
			defer conn.Close(c)
			for i := 0; i < per; i++ {
				err := pgx.BeginFunc(c, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(c, `INSERT INTO raw_events (session_id, body) VALUES ($1, '{"type":"user.interrupt"}')`, fmt.Sprint(w)); err != nil {
						return err
					}
					_, err := tx.Exec(c, `SELECT pg_notify('raw_bench', 's:1')`)
					return err
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	b.ReportMetric(float64(per*writers)/time.Since(start).Seconds(), "events/s")
}
