package usage_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/controlplane/usage"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/test/fleettest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Three real Raft nodes, each with its meter over one real PostgreSQL,
// and a real host: the sandbox placed and ready opens one running
// interval; the leader is killed, and the new one carries the interval on
// (still one, from the same start) under its own term, and closes it when
// the sandbox is released.
func TestMeterAcrossALeaderChange(t *testing.T) {
	db := pgtest.New(t)
	st, err := store.Open(context.Background(), db.AppURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	if _, err := st.Tenants().Create(ctx, fleettest.Tenant, "test"); err != nil {
		t.Fatal(err)
	}
	// The host reconnects to the new leader after the kill: a TTL it
	// cannot outlast on a busy machine, or the host is marked down
	// meanwhile and its sandbox rightly counts nothing for that time (a
	// new interval), which is not what this tests.
	c := fleettest.Start(t, fleettest.Options{Nodes: 3, HostTTL: 30 * time.Second})
	meters := make([]*usage.Meter, 3)
	cancels := make([]context.CancelFunc, 3)
	for i := range meters {
		m, err := usage.New(usage.Config{Cluster: usage.Raft{Node: c.Node(i)}, Store: st.Usage()})
		if err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { m.Run(mctx); close(done) }()
		meters[i], cancels[i] = m, func() { cancel(); <-done }
		t.Cleanup(cancels[i])
	}
	c.StartHost("h1", fleettest.HostOptions{})
	c.WaitConnected("h1")
	leader := c.Leader()
	c.Sandbox(leader, "sesn_metered")

	open := func(what string, cond func([]store.SandboxInterval) bool) []store.SandboxInterval {
		t.Helper()
		var got []store.SandboxInterval
		waitfor.State(t, 30*time.Second, what, func() (bool, string) {
			var err error
			if got, err = st.Usage().OpenSandboxIntervals(ctx); err != nil {
				return false, err.Error()
			}
			return cond(got), fmt.Sprint(got)
		})
		return got
	}
	first := open("the running interval", func(l []store.SandboxInterval) bool {
		return len(l) == 1 && l[0].SessionID == "sesn_metered" && l[0].State == store.SandboxRunning && l[0].HostID == "h1"
	})

	cancels[leader]()
	c.Kill(leader)
	next := c.Leader()
	// The server's leadership observer does this.
	for i, m := range meters {
		if i != leader {
			m.LeaderChanged()
		}
	}
	term := c.Node(next).Term()
	su, err := pgx.Connect(ctx, db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	waitfor.State(t, 30*time.Second, "the new leader's claim", func() (bool, string) {
		var got int64
		if err := su.QueryRow(ctx, `SELECT term FROM usage_meter`).Scan(&got); err != nil {
			return false, err.Error()
		}
		return uint64(got) == term, fmt.Sprintf("term %d, the new leader's %d", got, term)
	})
	if l, _ := st.Usage().OpenSandboxIntervals(ctx); len(l) != 1 || !l[0].Since.Equal(first[0].Since) {
		t.Fatalf("after the leader change: %+v, want the one from %v", l, first[0].Since)
	}

	if _, err := c.Fleet(next).Release(c.Ctx(), "sesn_metered"); err != nil {
		t.Fatal(err)
	}
	open("the interval closed at release", func(l []store.SandboxInterval) bool { return len(l) == 0 })
	rows, err := st.Usage().Report(tenant.With(ctx, fleettest.Tenant), store.UsageQuery{
		Start: first[0].Since.Truncate(time.Hour), End: time.Now().Truncate(time.Hour).Add(time.Hour), Unit: store.UsageDay, Now: time.Now(), Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var running float64
	for _, r := range rows {
		running += r.RunningSeconds
	}
	if len(rows) == 0 || running <= 0 {
		t.Errorf("report after release: %+v", rows)
	}
	t.Logf("ran %.3fs across the leader change", running)
}
