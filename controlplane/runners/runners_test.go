package runners_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/events"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/controlplane/runners"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var tctx = tenant.With(context.Background(), tenant.Default)

// gatedModel answers "done" once released; it signals each call it gets.
type gatedModel struct {
	calls   chan struct{}
	release chan struct{}
}

func (g *gatedModel) Generate(ctx context.Context, _ model.Request, _ model.DeltaFunc) (model.Response, error) {
	g.calls <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return model.Response{}, ctx.Err()
	}
	return model.Response{Content: []model.Block{{Type: "text", Text: "done"}}, StopReason: "end_turn"}, nil
}

// node is one control-plane node's share of the test: a Raft member, a
// runner manager and a loop pool over the shared database.
type node struct {
	raft  *raftfsm.Node
	mgr   *runners.Manager
	pool  *agentloop.Pool
	model *gatedModel
	log   *logBuffer
}

func startNode(t *testing.T, st *store.Store, id string, via *node) *node {
	return startNodeWith(t, st, id, via, runners.Config{})
}

// startNodeWith starts a node whose manager takes cfg's Grace and Interval;
// it bootstraps a cluster, or joins via's with a fresh node token.
func startNodeWith(t *testing.T, st *store.Store, id string, via *node, cfg runners.Config) *node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rc := raftfsm.Config{
		ID: id, RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(), Bootstrap: via == nil,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaderLeaseTimeout: 150 * time.Millisecond,
	}
	if via != nil {
		tok, err := via.raft.IssueNodeToken(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rc.Join, rc.NodeJoinToken, rc.Seal = via.raft.HTTPAddr(), logging.Secret(tok.Reveal()), via.raft.Keyring()
	}
	rn, err := raftfsm.Start(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rn.Shutdown() })
	n := &node{raft: rn, model: &gatedModel{calls: make(chan struct{}, 10), release: make(chan struct{})}, log: &logBuffer{}}
	n.mgr = runners.New(runners.Config{
		Cluster: rn, Claim: st.Events().ClaimRunner, Pending: st.SessionsNeedingRunner,
		Wake:  func(ctx context.Context, t tenant.ID, s string) { n.pool.WakeFrom(ctx, t, s) },
		Grace: cfg.Grace, Interval: cfg.Interval, Logger: slog.New(slog.NewTextHandler(n.log, nil)),
	})
	runner := &agentloop.Loop{Store: events.LoopStore{St: st}, Model: n.model, Tools: agentloop.NoSandbox{}, NewID: store.NewEventID}
	n.pool = agentloop.NewPool(runner, n.mgr.Lock, slog.New(slog.NewTextHandler(n.log, nil)))
	t.Cleanup(n.pool.Stop)
	return n
}

// run runs the node's manager until the test ends.
func (n *node) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.mgr.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// openStore is a fresh database and the store over it.
func openStore(t *testing.T) (*pgtest.DB, *store.Store) {
	t.Helper()
	db := pgtest.New(t)
	st, err := store.Open(context.Background(), db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return db, st
}

func createSession(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	c := context.Background()
	conn, err := pgx.Connect(c, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(c)
	id := "sesn_runner_test"
	snap, _ := json.Marshal(agentloop.Agent{})
	for _, s := range []string{
		`INSERT INTO agents (tenant_id, id, latest_version) VALUES ('tenant_default', 'agent_t', 1)`,
		`INSERT INTO agent_versions (tenant_id, agent_id, version, name, spec) VALUES ('tenant_default', 'agent_t', 1, 't', '{}')`,
		`INSERT INTO environments (tenant_id, id, name, config) VALUES ('tenant_default', 'env_t', 't', '{}')`,
	} {
		if _, err := conn.Exec(c, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if _, err := conn.Exec(c, `INSERT INTO sessions (tenant_id, id, agent_id, agent_version, agent, environment_id)
		VALUES ('tenant_default', $1, 'agent_t', 1, $2, 'env_t')`, id, snap); err != nil {
		t.Fatal(err)
	}
	return id
}

func runnerOf(n *node, sid string) (a raftfsm.RunnerAssignment) {
	n.raft.Read(func(v raftfsm.View) { a, _ = v.Runner(sid) })
	return a
}

// TestReassignmentFencesTheOldRunner: node A runs a turn and waits on its
// model; the session is reassigned to node B, which finishes the turn; A's
// late append is refused and its loop stops; the log holds the turn once.
func TestReassignmentFencesTheOldRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts raft nodes on loopback")
	}
	db, st := openStore(t)
	a := startNode(t, st, "a", nil)
	waitfor.Cond(t, 30*time.Second, "a to lead", a.raft.IsLeader)
	b := startNode(t, st, "b", a)
	sid := createSession(t, db)

	body, _ := json.Marshal(map[string]any{"id": "sevt_user1", "type": "user.message", "content": []map[string]string{{"type": "text", "text": "hi"}}})
	if _, err := st.Events().AppendClient(tctx, sid, []store.NewEvent{{ID: "sevt_user1", Type: "user.message", Body: body}}); err != nil {
		t.Fatal(err)
	}
	a.mgr.WakeForInput(context.Background(), tenant.Default, sid)
	select {
	case <-a.model.calls:
	case <-time.After(20 * time.Second):
		t.Fatal("a never called its model")
	}
	if got := runnerOf(a, sid); got.NodeID != "a" || got.Epoch != 1 {
		t.Fatalf("assignment %+v, want a at epoch 1", got)
	}

	// B takes the session over (as input arriving at B does) and finishes
	// the turn at once.
	close(b.model.release)
	b.mgr.WakeForInput(context.Background(), tenant.Default, sid)
	waitfor.Cond(t, 30*time.Second, "b to finish the turn", func() bool {
		s, err := st.Events().LoopState(tctx, sid)
		return err == nil && s.Status == "idle" && runnerOf(b, sid).NodeID == "b"
	})

	// A's model answers now: its append must be refused and its loop stop.
	close(a.model.release)
	waitfor.Cond(t, 30*time.Second, "a's loop to stop as no longer the runner", func() bool {
		return strings.Contains(a.log.String(), "another node runs the session now")
	})

	evs, err := st.Events().List(tctx, sid, store.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var types []string
	for _, e := range evs {
		count[e.Type]++
		types = append(types, e.Type)
	}
	if count["user.message"] != 1 || count["agent.message"] != 1 || count["session.status_idle"] != 1 {
		t.Fatalf("log %v: want the user message, one answer and one idle", types)
	}

	// A stale epoch is refused on its own too, and a client append is not
	// affected by epochs.
	err = events.LoopStore{St: st}.Commit(events.WithRunnerEpoch(tctx, 1), sid, agentloop.Commit{Status: "idle"})
	if !errors.Is(err, agentloop.ErrNotRunner) || errdefs.KindOf(err) != errdefs.ConflictKind {
		t.Fatalf("append with epoch 1 after epoch 2 was claimed: %v, want a conflict naming the stale runner", err)
	}
	if err := st.Events().ClaimRunner(tctx, sid, 1); !errors.Is(err, store.ErrStaleRunner) {
		t.Fatalf("claiming an older epoch: %v", err)
	}
	body2, _ := json.Marshal(map[string]any{"id": "sevt_user2", "type": "user.message", "content": []any{}})
	if _, err := st.Events().AppendClient(tctx, sid, []store.NewEvent{{ID: "sevt_user2", Type: "user.message", Body: body2}}); err != nil {
		t.Fatalf("client append: %v", err)
	}
}

// logBuffer collects a node's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestSessionsMoveWhenTheirNodeLeaves: a session whose runner is removed
// from the cluster, or stops answering heartbeats for longer than the grace
// period, is moved by the leader to a live node, which resumes the loop and
// finishes the turn; the old runner's late append is refused.
// (The leader, a, keeps leading: it bootstrapped and the others joined.)
func TestSessionsMoveWhenTheirNodeLeaves(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipped because it starts raft nodes on loopback")
	}
	for _, how := range []string{"removed", "failing heartbeats"} {
		t.Run(how, func(t *testing.T) {
			db, st := openStore(t)
			cfg := runners.Config{Grace: time.Second, Interval: 50 * time.Millisecond}
			a := startNodeWith(t, st, "a", nil, cfg)
			waitfor.Cond(t, 30*time.Second, "a to lead", a.raft.IsLeader)
			b := startNodeWith(t, st, "b", a, cfg)
			// A third node keeps a quorum when b fails.
			c := startNodeWith(t, st, "c", a, cfg)
			a.run(t)
			b.run(t)
			c.run(t)
			sid := createSession(t, db)
			body, _ := json.Marshal(map[string]any{"id": "sevt_user1", "type": "user.message", "content": []map[string]string{{"type": "text", "text": "hi"}}})
			if _, err := st.Events().AppendClient(tctx, sid, []store.NewEvent{{ID: "sevt_user1", Type: "user.message", Body: body}}); err != nil {
				t.Fatal(err)
			}
			b.mgr.WakeForInput(context.Background(), tenant.Default, sid)
			select {
			case <-b.model.calls:
			case <-time.After(20 * time.Second):
				t.Fatal("b never called its model")
			}
			close(a.model.release)
			close(c.model.release)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			switch how {
			case "removed":
				if err := a.raft.RemoveServer(ctx, "b"); err != nil {
					t.Fatal(err)
				}
			default:
				if err := b.raft.Shutdown(); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("a's log:\n%s\nb's log:\n%s\nc's log:\n%s", a.log, b.log, c.log)
				}
			})
			waitfor.Cond(t, 30*time.Second, "a live node to finish the turn", func() bool {
				s, err := st.Events().LoopState(tctx, sid)
				r := runnerOf(a, sid).NodeID
				return err == nil && s.Status == "idle" && (r == "a" || r == "c")
			})
			close(b.model.release)
			waitfor.Cond(t, 30*time.Second, "b's loop to stop as no longer the runner", func() bool {
				return strings.Contains(b.log.String(), "another node runs the session now")
			})
			evs, err := st.Events().List(tctx, sid, store.EventQuery{})
			if err != nil {
				t.Fatal(err)
			}
			count := map[string]int{}
			for _, e := range evs {
				count[e.Type]++
			}
			if count["user.message"] != 1 || count["agent.message"] != 1 || count["session.status_idle"] != 1 {
				t.Fatalf("log %v: want the user message, one answer and one idle", count)
			}
		})
	}
}

// TestPrepareTakesANewSessionsRunner: Prepare, as a session is created
// through a node, assigns the session to that node (a follower here) and
// claims the epoch in the database, so that its first input's wake commits
// neither.
func TestPrepareTakesANewSessionsRunner(t *testing.T) {
	db, st := openStore(t)
	a := startNode(t, st, "a", nil)
	waitfor.Cond(t, 30*time.Second, "a to lead", a.raft.IsLeader)
	b := startNode(t, st, "b", a)
	sid := createSession(t, db)

	epochInDB := func() int64 {
		conn, err := pgx.Connect(context.Background(), db.SuperuserURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var e int64
		if err := conn.QueryRow(context.Background(), `SELECT runner_epoch FROM sessions WHERE id = $1`, sid).Scan(&e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	b.mgr.Prepare(tenant.Default, sid)
	waitfor.State(t, 30*time.Second, "b to hold the new session's runner role, claimed", func() (bool, string) {
		r := runnerOf(b, sid)
		e := epochInDB()
		return r.NodeID == "b" && r.Epoch > 0 && e == int64(r.Epoch), fmt.Sprintf("assignment %+v, epoch in the database %d", r, e)
	})
}
