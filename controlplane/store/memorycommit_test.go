package store_test

import (
	"context"
	"strings"
	"testing"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Two sessions commit back changes to one store from the same base: the
// first applies; the second's change to the same memory is a conflict,
// never written over the first: both are kept, the second's beside it.
// A removal of a memory changed since is refused and reported; versions
// name the session that wrote each.
func TestMemoryCommitDetectsConflicts(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	ms := s.MemoryStores()
	key := store.Actor{Type: store.ActorAPI, ID: "key_1"}
	one := store.Actor{Type: store.ActorSession, ID: "sesn_one"}
	two := store.Actor{Type: store.ActorSession, ID: "sesn_two"}
	str := func(s string) *string { return &s }

	st, err := ms.Create(ctx, store.MemoryStore{Name: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	base, err := ms.CreateMemory(ctx, st.ID, "/notes.md", "v0", key)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := ms.CreateMemory(ctx, st.ID, "/old.md", "old", key)
	if err != nil {
		t.Fatal(err)
	}

	// Session one: changes notes, adds new.md, removes old.md.
	c1, err := ms.Commit(ctx, st.ID, []store.MemoryChange{
		{Path: "/notes.md", Content: str("v1 by one"), BaseSHA256: base.SHA256},
		{Path: "/new.md", Content: str("new by one")},
		{Path: "/old.md", BaseSHA256: gone.SHA256},
	}, one)
	if err != nil || len(c1.Conflicts) != 0 || len(c1.Versions) != 3 ||
		c1.Versions[0].Operation != store.MemoryModified || c1.Versions[1].Operation != store.MemoryCreated || c1.Versions[2].Operation != store.MemoryDeleted {
		t.Fatalf("commit one = %+v, %v", c1, err)
	}

	// Session two saw the same base: each of its changes conflicts.
	c2, err := ms.Commit(ctx, st.ID, []store.MemoryChange{
		{Path: "/notes.md", Content: str("v1 by two"), BaseSHA256: base.SHA256},
		{Path: "/new.md", Content: str("new by two")},
		{Path: "/old.md", Content: str("old edited by two"), BaseSHA256: gone.SHA256},
		{Path: "/same.md", Content: str("same")},
	}, two)
	if err != nil || len(c2.Conflicts) != 3 {
		t.Fatalf("commit two = %+v, %v", c2, err)
	}
	for i, p := range []string{"/notes.md", "/new.md", "/old.md"} {
		c := c2.Conflicts[i]
		if c.Path != p || c.KeptAt != p+".conflict-sesn_two" || !strings.Contains(c.Reason, "another writer") {
			t.Errorf("conflict %d = %+v", i, c)
		}
	}
	items, _, err := ms.ListMemories(ctx, st.ID, store.MemoryListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, it := range items {
		got[it.Memory.Path] = it.Memory.Content
	}
	want := map[string]string{
		"/notes.md": "v1 by one", "/notes.md.conflict-sesn_two": "v1 by two",
		"/new.md": "new by one", "/new.md.conflict-sesn_two": "new by two",
		"/old.md.conflict-sesn_two": "old edited by two", "/same.md": "same",
	}
	if len(got) != len(want) {
		t.Fatalf("memories = %v", got)
	}
	for p, c := range want {
		if got[p] != c {
			t.Errorf("%s = %q, want %q", p, got[p], c)
		}
	}

	// A removal of a memory another writer changed since: refused,
	// reported, nothing removed.
	c3, err := ms.Commit(ctx, st.ID, []store.MemoryChange{{Path: "/notes.md", BaseSHA256: base.SHA256}}, two)
	if err != nil || len(c3.Conflicts) != 1 || len(c3.Versions) != 0 {
		t.Fatalf("a stale removal = %+v, %v", c3, err)
	}

	// Who changed what: the versions of each session.
	for actor, n := range map[store.Actor]int{one: 3, two: 4} {
		vs, _, err := ms.ListVersions(ctx, st.ID, store.MemoryVersionListOptions{Actor: &actor})
		if err != nil || len(vs) != n {
			t.Errorf("versions by %s = %d, %v; want %d", actor.ID, len(vs), err, n)
		}
	}

	// Bounds: an oversized memory is a reported refusal, the rest apply;
	// a commit past its total is refused whole.
	c4, err := ms.Commit(ctx, st.ID, []store.MemoryChange{
		{Path: "/big.md", Content: str(strings.Repeat("x", store.MaxMemoryBytes+1))},
		{Path: "/small.md", Content: str("s")},
	}, one)
	if err != nil || len(c4.Conflicts) != 1 || c4.Conflicts[0].Path != "/big.md" || c4.Conflicts[0].KeptAt != "" || len(c4.Versions) != 1 {
		t.Fatalf("an oversized change = %+v, %v", c4, err)
	}
	var many []store.MemoryChange
	for range store.MaxCommitChanges + 1 {
		many = append(many, store.MemoryChange{Path: "/x.md", Content: str("x")})
	}
	if _, err := ms.Commit(ctx, st.ID, many, one); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Fatalf("a commit past its bound: %v", err)
	}
}
