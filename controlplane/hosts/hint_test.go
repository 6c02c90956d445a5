package hosts_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"corral.dev/corral/hostagent/agent"
	"corral.dev/corral/hostagent/driver/process"
	"corral.dev/corral/internal/waitfor"
	"corral.dev/corral/test/fleettest"
)

// TestHostFollowsLeaderHint: a host refused by a follower goes to the
// leader it names within one heartbeat. The agent knows only a follower's
// address and waits a minute between attempts, so only the hint can take it
// to the leader in time; the test drives its reconnect timer and checks the
// agent never asked for it on the way. Then the leader dies: after one
// reconnect wait the agent asks the follower again and reaches the new
// leader (through the hint, unless the follower itself now leads).
func TestHostFollowsLeaderHint(t *testing.T) {
	c := fleettest.Start(t, fleettest.Options{Nodes: 3})
	l := c.Leader()
	f := c.Follower()
	d, err := process.New(process.Config{Dir: t.TempDir(), AllowUntrusted: true})
	if err != nil {
		t.Fatal(err)
	}
	var waits atomic.Int32
	reconnect := make(chan time.Time)
	a, err := agent.New(context.Background(), agent.Config{
		HostID: "h1", ControlPlane: c.HostAddr(f), JoinToken: c.Token(), StateDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", Driver: d, Runtime: "process",
		Capacity:       agent.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30},
		ReconnectDelay: time.Minute,
		After: func(time.Duration) <-chan time.Time {
			waits.Add(1)
			return reconnect
		},
		// Registering takes a moment, as listing containerd's images does:
		// by the time the agent sends Register the follower has ended the
		// stream, and Send fails with io.EOF instead of the follower's
		// answer. (A delay standing in for work, not a wait for a loop.)
		Images: func(context.Context) ([]string, error) {
			time.Sleep(100 * time.Millisecond)
			return nil, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	// The bound is the agent's default heartbeat interval, 10s: a hint taken
	// at once needs a fraction of it; a reconnect wait would be a minute.
	start := time.Now()
	waitfor.Cond(t, 10*time.Second, "the host on the leader", func() bool { return c.Hosts(l).Connected("h1") })
	if n := waits.Load(); n != 0 {
		t.Fatalf("the agent waited %d times for its reconnect timer before reaching the leader; it should follow the hint at once", n)
	}
	t.Logf("on the leader n%d %v after starting, through follower n%d", l+1, time.Since(start).Round(time.Millisecond), f+1)

	// The leader dies. The agent's stream breaks without a hint, so it
	// waits once; once a new leader is elected the follower names it.
	c.Kill(l)
	nl := c.Leader()
	fired := 0
	deadline := time.After(15 * time.Second)
	for !c.Hosts(nl).Connected("h1") {
		select {
		case reconnect <- time.Now():
			fired++
		case <-time.After(10 * time.Millisecond): // polling Connected, bounded by the deadline
		case <-deadline:
			t.Fatalf("the host is not on the new leader n%d 15s after the old one died (%d reconnect waits fired)", nl+1, fired)
		}
	}
	how := "through the follower's hint"
	if nl == f {
		how = "directly: the follower it knows now leads"
	}
	t.Logf("on the new leader n%d %s, after %d reconnect waits", nl+1, how, fired)
	// One wait is the norm; a follower that has not yet heard from the new
	// leader may name the dead one once more.
	if fired > 3 {
		t.Errorf("the agent needed %d reconnect attempts to reach the new leader; with a leader elected the follower's hint should take it there", fired)
	}
}
