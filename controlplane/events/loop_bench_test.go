package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
)

// BenchmarkLoopStepLongSession measures what one step of the agent loop
// costs in a session whose log already holds 1,000 events, next to one that
// holds 10, in the same run: the loop must not get slower as a session gets
// longer. The model is the fake one and tools answer at once, so a step is
// the loop's own cost (reading the log, deciding, committing to
// PostgreSQL). Each iteration runs one turn of each size, interleaved, each
// on a fresh session:
//
//	user.message → StartTurn with the first CallModel → bash, RunTools,
//	4 × (CallModel → bash, RunTools), CallModel → "done", EndTurn, Wait
//
// A step starts where the loop reads the store before deciding. The
// first step of a wake reads the whole log, which is reported apart. Each
// figure is made of medians, one per step of the turn across iterations,
// since this machine's other load comes in bursts that a mean takes in:
//
//	us/step-10, us/step-1000   a step after the first, and step-1000/step-10 their ratio
//	us/wake-10, us/wake-1000   the first step, with the read of the whole log
//	turn-1000/turn-10          the whole turn, first step included
func BenchmarkLoopStepLongSession(b *testing.B) {
	h := newHarness(b)
	const rounds = 5
	const steps = 2*rounds + 3
	script := strings.Repeat("!tool bash {\"command\":\"true\"}\n", rounds)
	var agent agentloop.Agent
	agent.Model.ID = "fake"
	agent.Tools = []agentloop.ToolSpec{{Type: agentloop.AgentToolset}}
	clock := &stepClock{Store: tenantStore{events.LoopStore{St: h.st}}}
	runner := &agentloop.Loop{Store: clock, Model: model.Fake{}, Tools: allowTools{}, NewID: store.NewEventID}
	sizes := []int{10, 1000}
	// Every session is written before the clock starts, and vacuumed: a
	// long session's old events have long settled, and a 1,000-row insert
	// just before a turn would have the turn compete with its aftermath
	// (autovacuum, hint bits) on this machine's few cores.
	sessions := make([][]string, b.N)
	for i := range sessions {
		for _, n := range sizes {
			id := h.createSession(b, agent)
			if _, err := h.st.Events().Append(ctx, id, store.Append{Events: pastTurns(n)}); err != nil {
				b.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"id": "sevt_msg_" + id, "type": "user.message", "content": []map[string]string{{"type": "text", "text": script}}})
			if _, err := h.st.Events().AppendClient(ctx, id, []store.NewEvent{{ID: "sevt_msg_" + id, Type: "user.message", Body: body}}); err != nil {
				b.Fatal(err)
			}
			sessions[i] = append(sessions[i], id)
		}
	}
	h.vacuum(b)
	runtime.GC() // the set-up's garbage is not the turns' to collect
	// took[j][k][i]: step k of iteration i's turn of size j; the last
	// step ends when Run returns.
	took := make([][][]time.Duration, len(sizes))
	for j := range took {
		took[j] = make([][]time.Duration, steps)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, n := range sizes {
			id := sessions[i][j]
			clock.starts = clock.starts[:0]
			if err := runner.Run(ctx, id); err != nil {
				b.Fatal(err)
			}
			end := time.Now()
			if len(clock.starts) != steps {
				b.Fatalf("the turn took %d steps, want %d", len(clock.starts), steps)
			}
			for k, t0 := range clock.starts {
				t1 := end
				if k+1 < steps {
					t1 = clock.starts[k+1]
				}
				took[j][k] = append(took[j][k], t1.Sub(t0))
			}
			if i == 0 {
				b.StopTimer()
				checkBenchTurn(b, h, id, n, rounds)
				b.StartTimer()
			}
		}
	}
	b.StopTimer()
	median := func(ds []time.Duration) float64 {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Nanoseconds()) / 1e3
	}
	wake := make([]float64, len(sizes))
	rest := make([]float64, len(sizes))
	for j := range sizes {
		wake[j] = median(took[j][0])
		for k := 1; k < steps; k++ {
			rest[j] += median(took[j][k])
		}
	}
	step10, step1000 := rest[0]/(steps-1), rest[1]/(steps-1)
	b.ReportMetric(step10, "us/step-10")
	b.ReportMetric(step1000, "us/step-1000")
	b.ReportMetric(step1000/step10, "step-1000/step-10")
	b.ReportMetric(wake[0], "us/wake-10")
	b.ReportMetric(wake[1], "us/wake-1000")
	b.ReportMetric((wake[1]+rest[1])/(wake[0]+rest[0]), "turn-1000/turn-10")
}

// stepClock notes when each step starts: each step begins with one read
// of the store, the whole log or what follows what the loop has.
type stepClock struct {
	agentloop.Store
	starts []time.Time
}

func (c *stepClock) Load(ctx context.Context, id string) (agentloop.Agent, []agentloop.Event, error) {
	c.starts = append(c.starts, time.Now())
	return c.Store.Load(ctx, id)
}

func (c *stepClock) LoadSince(ctx context.Context, id string, after int64) ([]agentloop.Event, error) {
	c.starts = append(c.starts, time.Now())
	return c.Store.LoadSince(ctx, id, after)
}

// pastTurns is n events of finished turns, shaped like real ones: a user
// message, a model call that runs bash, its result, a model call that
// answers, ten events a turn.
func pastTurns(n int) []store.NewEvent {
	out := make([]store.NewEvent, 0, n)
	add := func(id, typ string, fields map[string]any) {
		if len(out) == n {
			return
		}
		if id == "" {
			id = store.NewEventID()
		}
		fields["id"], fields["type"] = id, typ
		b, _ := json.Marshal(fields)
		out = append(out, store.NewEvent{ID: id, Type: typ, Body: b})
	}
	text := func(s string) []map[string]string { return []map[string]string{{"type": "text", "text": s}} }
	usage := map[string]int{"input_tokens": 1200, "output_tokens": 80}
	for t := 0; len(out) < n; t++ {
		start, use := store.NewEventID(), store.NewEventID()
		add("", "user.message", map[string]any{"content": text(fmt.Sprintf("turn %d: please look at the build and fix what fails", t))})
		add("", "session.status_running", map[string]any{})
		add(start, "span.model_request_start", map[string]any{})
		add(use, "agent.tool_use", map[string]any{"name": "bash", "input": map[string]string{"command": "go test ./... 2>&1 | tail -n 40"}, "evaluated_permission": "allow"})
		add("", "span.model_request_end", map[string]any{"model_request_start_id": start, "is_error": false, "model_usage": usage})
		add("", "agent.tool_result", map[string]any{"tool_use_id": use, "content": text(strings.Repeat("ok  \tcorral.dev/corral/controlplane/some/package\t0.123s\n", 10)), "is_error": false})
		start = store.NewEventID()
		add(start, "span.model_request_start", map[string]any{})
		add("", "agent.message", map[string]any{"content": text("All the tests pass now; the failure was a stale fixture, which I regenerated.")})
		add("", "span.model_request_end", map[string]any{"model_request_start_id": start, "is_error": false, "model_usage": usage})
		add("", "session.status_idle", map[string]any{"stop_reason": map[string]string{"type": "end_turn"}})
	}
	return out
}

// checkBenchTurn makes sure the turn measured is the one described: the
// tools ran, and the turn ended.
func checkBenchTurn(b *testing.B, h *pgHarness, id string, past, rounds int) {
	b.Helper()
	_, log, err := tenantStore{events.LoopStore{St: h.st}}.Load(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	results := 0
	for _, e := range log[past:] {
		if e.Type == agentloop.AgentToolResult && !e.IsError {
			results++
		}
	}
	last := log[len(log)-1]
	if results != rounds || last.Type != agentloop.StatusIdle || last.StopReason == nil || last.StopReason.Type != "end_turn" {
		b.Fatalf("the turn measured ran %d tools and ended with %+v, want %d and end_turn", results, last, rounds)
	}
}

// vacuum vacuums and analyzes the database (as the superuser).
func (h *pgHarness) vacuum(b *testing.B) {
	b.Helper()
	c := context.Background()
	conn, err := pgx.Connect(c, h.db.SuperuserURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(c)
	if _, err := conn.Exec(c, "VACUUM (ANALYZE)"); err != nil {
		b.Fatal(err)
	}
}
