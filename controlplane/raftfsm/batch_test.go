package raftfsm

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/scheduler/schedulertest"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/waitfor"
)

// A place_batch applies each item on its own: one that fails (a stale
// plan without its request, a tenant over its quota) fails alone; a
// stale one with its request is planned again; each has its own
// idempotency key, and a session placed twice keeps its first placement.
func TestPlaceBatchItemsStandAlone(t *testing.T) {
	f, apply := fsmSetup(t, scheduler.Quota{ConcurrentSandboxes: 1}, 0)
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h1", 1000, 4096)))
	must(t, apply(CmdRegisterHost, "", schedulertest.Host("h2", 4000, 4096)))
	must(t, apply(CmdPlace, "before", PlacePayload{Plan: plan("s0", "t0", "h2", 500)}))

	cfg := scheduler.DefaultConfig
	req := func(session, tenant string, cpu int64) *scheduler.Request {
		return &scheduler.Request{SessionID: session, Tenant: tenant, Runtime: "runsc", Resources: scheduler.Resources{CPUMillis: cpu, MemoryMiB: 512}}
	}
	items := []PlaceItem{
		{"k1", PlacePayload{Plan: plan("s1", "t1", "h1", 1000)}},                                               // fills h1
		{"k2", PlacePayload{Plan: plan("s2", "t2", "h1", 500)}},                                                // stale, no request: conflict
		{"k3", PlacePayload{Plan: plan("s3", "t3", "h1", 500), Request: req("s3", "t3", 500), Config: &cfg}},   // stale: planned again, h2
		{"k4", PlacePayload{Plan: plan("s4", "t1", "h2", 100)}},                                                // t1's second sandbox: over its quota
		{"k5", PlacePayload{Plan: plan("s1", "t1", "h2", 1000), Request: req("s1", "t1", 1000), Config: &cfg}}, // s1 again: its placement on h1
		{"before", PlacePayload{Plan: plan("s0", "t0", "h2", 500)}},                                            // a key applied before: replayed
	}
	batch := func(items []PlaceItem) []Result {
		t.Helper()
		r := apply(CmdPlaceBatch, "", PlaceBatchPayload{Items: items})
		if r.Err != nil || len(r.batch) != len(items) {
			t.Fatalf("batch of %d: %+v", len(items), r)
		}
		return r.batch
	}
	res := batch(items)
	placed := func(i int, host string) scheduler.Placement {
		t.Helper()
		var p scheduler.Placement
		if err := res[i].Decode(&p); err != nil || p.HostID != host {
			t.Fatalf("item %d: %+v %v, want a placement on %s", i, p, err, host)
		}
		return p
	}
	failed := func(i int, kind errdefs.Kind) {
		t.Helper()
		if errdefs.KindOf(res[i].Error()) != kind {
			t.Fatalf("item %d: %+v, want %s", i, res[i], kind)
		}
	}
	p1 := placed(0, "h1")
	failed(1, errdefs.ConflictKind)
	p3 := placed(2, "h2")
	failed(3, errdefs.ResourceExhaustedKind)
	if p := placed(4, "h1"); p.SandboxID != p1.SandboxID {
		t.Fatalf("s1 placed twice: %+v and %+v", p1, p)
	}
	if !res[5].Replayed {
		t.Fatalf("item 5 reused an applied key: %+v, want it replayed", res[5])
	}
	// The batch is at index 4: its sandboxes are named by index and
	// position, unique on every replica.
	if p1.SandboxID != "sbx-4-0" || p3.SandboxID != "sbx-4-2" {
		t.Fatalf("sandbox ids %s, %s; want sbx-4-0, sbx-4-2", p1.SandboxID, p3.SandboxID)
	}
	f.Read(func(v View) {
		if _, ok := v.Placement("s2"); ok {
			t.Fatal("the stale plan without its request was placed")
		}
		if u := v.Usage("t1"); u.Sandboxes != 1 {
			t.Fatalf("t1 holds %d sandboxes, quota 1", u.Sandboxes)
		}
	})

	// Each item's key is its own: the same items again, in a new batch or
	// alone, replay their first results.
	for i, r := range batch(items[:4]) {
		if !r.Replayed || string(r.Value) != string(res[i].Value) || fmt.Sprint(r.Err) != fmt.Sprint(res[i].Err) {
			t.Fatalf("item %d again: %+v, want the replay of %+v", i, r, res[i])
		}
	}
	if r := apply(CmdPlace, "k3", PlacePayload{Plan: plan("s3", "t3", "h1", 500)}); !r.Replayed || string(r.Value) != string(res[2].Value) {
		t.Fatalf("k3 alone after the batch: %+v, want its batch result replayed", r)
	}
}

// The leader groups the place commands that reach it together into one
// entry, and each caller gets its own result: one that cannot be placed
// fails alone. The batchers are held busy so the commands queue, then let
// go: they commit in batches of at most PlaceBatch.
func TestLeaderBatchesPlacements(t *testing.T) {
	nodes, _ := clusterSetup(t)
	leader := leaderOf(t, nodes...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 4 {
		if _, err := Apply(ctx, leader, RegisterHost, "", schedulertest.Host(fmt.Sprintf("h%d", i), 64000, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	b := leader.batch
	// An idle leader commits a placement at once, alone, as a place
	// command (its sandbox is named by the index only): no wait added.
	before := b.entries.Load()
	alone, err := placeOrLet(ctx, leader, scheduler.Request{SessionID: "alone", Tenant: "t", Runtime: "runsc", Resources: scheduler.Resources{CPUMillis: 100}})
	if err != nil || b.entries.Load() != before+1 || strings.Count(alone.SandboxID, "-") != 1 {
		t.Fatalf("a lone placement: %+v %v, %d entries; want one place entry", alone, err, b.entries.Load()-before)
	}
	b.max = 16
	// Hold every worker: each takes one call that answers only when let go.
	hold := make(chan struct{})
	commit := b.commit
	var held sync.WaitGroup
	held.Add(placeBatchers)
	b.commit = func(body []byte) (Result, error) {
		var c Command
		if json.Unmarshal(body, &c); c.Type == CmdPlace && len(c.IdempotencyKey) > 5 && c.IdempotencyKey[:5] == "hold/" {
			held.Done()
			<-hold
		}
		return commit(body)
	}
	var wg sync.WaitGroup
	type outcome struct {
		p   scheduler.Placement
		err error
	}
	const n = 40
	out := make([]outcome, n)
	for i := range placeBatchers {
		wg.Go(func() {
			req := scheduler.Request{SessionID: fmt.Sprintf("held-%d", i), Tenant: "t", Runtime: "runsc", Resources: scheduler.Resources{CPUMillis: 100}}
			cfg := scheduler.Config{}
			if _, err := Apply(ctx, leader, Place, fmt.Sprintf("hold/%d", i), PlacePayload{Request: &req, Config: &cfg}); err != nil {
				t.Errorf("held %d: %v", i, err)
			}
		})
	}
	held.Wait()
	entries := b.entries.Load()
	for i := range n {
		wg.Go(func() {
			req := scheduler.Request{SessionID: fmt.Sprintf("s%d", i), Tenant: fmt.Sprintf("t%d", i%3), Runtime: "runsc",
				Resources: scheduler.Resources{CPUMillis: 250, MemoryMiB: 256}}
			if i%10 == 7 {
				req.Resources.CPUMillis = 1 << 40 // fits no host
			}
			out[i].p, out[i].err = placeOrLet(ctx, nodes[i%3], req) // from followers too: forwarded
		})
	}
	waitfor.Cond(t, 30*time.Second, "the placements to queue on the leader", func() bool { return len(b.in) == n })
	// A place forwarded with a payload that does not decode goes alone,
	// and fails alone, while the others wait in the queue.
	bad := Command{Type: CmdPlace, IdempotencyKey: "bad", Payload: json.RawMessage(`{"plan":5}`)}
	if r, err := follower(nodes, leader).applyCommand(ctx, bad); err != nil || errdefs.KindOf(r.Error()) != errdefs.InvalidArgumentKind {
		t.Fatalf("a place that does not decode: %+v %v, want invalid argument", r, err)
	}
	close(hold)
	wg.Wait()
	sandboxes := map[string]bool{}
	for i, o := range out {
		if i%10 == 7 {
			if !scheduler.IsNoFit(o.err) && errdefs.KindOf(o.err) != errdefs.ResourceExhaustedKind {
				t.Errorf("s%d, too big for any host: %v, want resource exhausted", i, o.err)
			}
			continue
		}
		if o.err != nil || o.p.SessionID != fmt.Sprintf("s%d", i) || sandboxes[o.p.SandboxID] {
			t.Errorf("s%d: %+v %v", i, o.p, o.err)
		}
		sandboxes[o.p.SandboxID] = true
	}
	// 40 queued commands, in batches of at most 16: 3 to 4 entries (more
	// only if a worker took one before the rest queued).
	got := b.entries.Load() - entries - placeBatchers
	t.Logf("%d queued placements committed in %d entries", n, got)
	if got < 3 || got > n/2 {
		t.Fatalf("%d queued placements took %d entries, want them batched (at most 16 each)", n, got)
	}
	// Every replica holds the same placements.
	for _, nd := range nodes {
		if err := nd.Wait(ctx, func(v View) bool { return len(v.Placements()) == n-n/10+placeBatchers+1 }); err != nil {
			t.Fatalf("%s: %v", nd.ID(), err)
		}
	}
}

// placeOrLet is place, but a request that fits no host on n's state goes
// to the FSM to plan, as the fleet's do.
func placeOrLet(ctx context.Context, n *Node, req scheduler.Request) (scheduler.Placement, error) {
	var plan scheduler.Plan
	cfg := scheduler.Config{}
	var err error
	n.Read(func(v View) { plan, err = scheduler.Place(v, req, cfg) })
	if scheduler.IsNoFit(err) {
		plan, err = scheduler.Plan{}, nil
	}
	if err != nil {
		return scheduler.Placement{}, err
	}
	return Apply(ctx, n, Place, Key("place/"+req.SessionID), PlacePayload{Plan: plan, Request: &req, Config: &cfg})
}
