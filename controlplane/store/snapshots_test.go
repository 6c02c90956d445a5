package store_test

import (
	"encoding/json"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
)

// A session's snapshots list oldest first, only in their tenant, are
// dropped before a seq, and go with their session.
func TestWorkspaceSnapshots(t *testing.T) {
	s, ctx, other := setupResources(t)
	ag, err := s.Agents().Create(ctx, "a", spec("x"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.Environments().Create(ctx, store.Environment{Name: "e", Config: json.RawMessage(`{}`), Scope: "organization"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Sessions().Create(ctx, store.Session{AgentID: ag.ID, AgentVersion: 1, Agent: ag.Spec, EnvironmentID: env.ID})
	if err != nil {
		t.Fatal(err)
	}
	taken := time.Now().UTC().Truncate(time.Microsecond)
	for seq := int64(1); seq <= 3; seq++ {
		w := store.WorkspaceSnapshot{SessionID: sess.ID, Seq: seq, BlobKey: "snapshots/x/" + string(rune('0'+seq)) + ".tar", Full: seq == 1,
			Origin: "turn", HostID: "h1", SandboxID: "sb1", TakenAt: taken.Add(time.Duration(seq) * time.Second), Files: seq, Bytes: 10 * seq}
		if err := s.Snapshots().Add(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Snapshots().Add(ctx, store.WorkspaceSnapshot{SessionID: sess.ID, Seq: 3, BlobKey: "k", Origin: "turn", TakenAt: taken}); err == nil {
		t.Error("a second snapshot with the same seq was recorded")
	}
	list, err := s.Snapshots().List(ctx, sess.ID)
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if w := list[0]; w.Seq != 1 || !w.Full || w.Origin != "turn" || w.HostID != "h1" || w.SandboxID != "sb1" ||
		!w.TakenAt.Equal(taken.Add(time.Second)) || w.Files != 1 || w.Bytes != 10 || w.CreatedAt.IsZero() {
		t.Errorf("first snapshot read back as %+v", w)
	}
	if list[2].Seq != 3 || list[2].Full {
		t.Errorf("last snapshot %+v", list[2])
	}
	if got, err := s.Snapshots().List(other, sess.ID); err != nil || len(got) != 0 {
		t.Errorf("another tenant lists %+v, %v", got, err)
	}
	if err := s.Snapshots().DropBefore(other, sess.ID, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshots().DropBefore(ctx, sess.ID, 3); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.Snapshots().List(ctx, sess.ID); len(list) != 1 || list[0].Seq != 3 {
		t.Errorf("after DropBefore(3): %+v (another tenant's drop must not count)", list)
	}
	if err := s.Sessions().Delete(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	if list, err := s.Snapshots().List(ctx, sess.ID); err != nil || len(list) != 0 {
		t.Errorf("after the session's deletion: %+v, %v", list, err)
	}
}
