package server_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/scheduler"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// A drain through the admin API moves a live session's sandbox, with its
// files, to the other host between two tool calls; the session's next call
// runs there and reads what the first wrote, with no error, told that its
// sandbox moved with its workspace.
func TestDrainMovesASessionBetweenToolCalls(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process",
		HostHeartbeatInterval: 100 * time.Millisecond, HostTTL: 2 * time.Second})
	d1, _ := startHost(t, srv, "h1")
	d2, _ := startHost(t, srv, "h2")
	count := map[string]func() int{"h1": func() int { return sandboxCount(t, d1) }, "h2": func() int { return sandboxCount(t, d2) }}
	s := newToolSession(t, srv)

	toolOutput(t, s.turn(`!tool bash {"command":"echo 42 > out.txt && mkdir -p sub && echo nested > sub/f"}`))
	from, _, ok := placement(srv, s.id)
	if !ok || count[from]() != 1 {
		t.Fatalf("after turn 1: placement on %q (%v), %d sandboxes there", from, ok, count[from]())
	}
	to := map[string]string{"h1": "h2", "h2": "h1"}[from]

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", servertest.OperatorKey(t, db))
	stream, err := adminv1.NewHostsServiceClient(dial(t, srv.GRPCAddr())).DrainHost(ctx, &adminv1.DrainHostRequest{HostId: from, Deadline: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var last *adminv1.DrainHostResponse
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
		t.Logf("drain progress: moved %d, evicted %d, remaining %d: %s", m.GetMoved(), m.GetEvicted(), m.GetRemaining(), m.GetMessage())
		last = m
	}
	// Every message carries the drain's counts so far.
	if last == nil || !last.GetDone() || last.GetRemaining() != 0 || last.GetMoved() != 1 || last.GetEvicted() != 0 || last.GetTotal() != 1 {
		t.Fatalf("drain: last message %v", last)
	}
	if host, _, ok := placement(srv, s.id); !ok || host != to {
		t.Fatalf("after the drain the session is placed on %q (%v), want %s", host, ok, to)
	}
	waitfor.Cond(t, 30*time.Second, "the drained host to destroy its sandbox", func() bool { return count[from]() == 0 })

	out := toolOutput(t, s.turn(`!tool bash {"command":"cat out.txt sub/f"}`))
	if !strings.Contains(out, "42") || !strings.Contains(out, "nested") {
		t.Fatalf("the call after the drain did not find turn 1's files: %q", out)
	}
	// The session is told how its sandbox moved (with its workspace: a
	// process host cannot move live), and nothing else is said lost.
	rest, told := strings.CutPrefix(out, fleet.MovedNotice[scheduler.MovedWorkspace])
	if !told || strings.Contains(strings.ToLower(rest), "gone") {
		t.Fatalf("the call after a drain did not say it moved with its workspace, or reported lost files: %q", out)
	}
	if count[to]() != 1 {
		t.Fatalf("%d sandboxes on %s after the call, want 1", count[to](), to)
	}
	for _, e := range s.events() {
		if e["type"] == "session.error" {
			t.Fatalf("session error during the drain: %v", e)
		}
	}
}
