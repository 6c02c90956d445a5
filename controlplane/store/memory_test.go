package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Memory stores against real PostgreSQL: every write makes a version with
// its author; a content_sha256 precondition that does not hold is a
// conflict and changes nothing; a redacted version loses its content and
// path and keeps its record; listing pages in path order and rolls up
// directories; tenant B sees none of it.
func TestMemoryStores(t *testing.T) {
	db := pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s := open(t, db.AppURL)
	a := tenant.With(context.Background(), tenant.Default)
	b := tenant.With(context.Background(), "tenant_b")
	ms := s.MemoryStores()
	key := store.Actor{Type: store.ActorAPI, ID: "key_1"}
	sess := store.Actor{Type: store.ActorSession, ID: "sesn_1"}

	st, err := ms.Create(a, store.MemoryStore{Name: "notes", Metadata: map[string]string{"k": "v"}})
	if err != nil || !strings.HasPrefix(st.ID, store.MemoryStoreIDPrefix) || st.Name != "notes" || st.Metadata["k"] != "v" {
		t.Fatalf("Create = %+v, %v", st, err)
	}
	m, err := ms.CreateMemory(a, st.ID, "/a/one.md", "first", key)
	if err != nil || m.SHA256 != store.ContentSHA256("first") || m.SizeBytes != 5 || m.VersionID == "" {
		t.Fatalf("CreateMemory = %+v, %v", m, err)
	}
	if _, err := ms.CreateMemory(a, st.ID, "/a/one.md", "again", key); !errdefs.IsConflict(err) {
		t.Fatalf("a second memory at the same path: %v, want a conflict", err)
	}

	// A stale precondition: 409, nothing changed, no version written.
	second := "second"
	if _, err := ms.UpdateMemory(a, st.ID, m.ID, store.MemoryUpdate{Content: &second, ExpectSHA256: store.ContentSHA256("stale")}, sess); !errdefs.IsConflict(err) {
		t.Fatalf("update with a stale precondition: %v, want a conflict", err)
	}
	if got, _ := ms.GetMemory(a, st.ID, m.ID); got.Content != "first" {
		t.Fatalf("after a refused update the content is %q", got.Content)
	}
	m2, err := ms.UpdateMemory(a, st.ID, m.ID, store.MemoryUpdate{Content: &second, ExpectSHA256: m.SHA256}, sess)
	if err != nil || m2.Content != "second" || m2.VersionID == m.VersionID {
		t.Fatalf("update with the current precondition = %+v, %v", m2, err)
	}
	if err := ms.DeleteMemory(a, st.ID, m.ID, m.SHA256, key); !errdefs.IsConflict(err) {
		t.Fatalf("delete with a stale precondition: %v, want a conflict", err)
	}

	// Versions, newest first, with who wrote each.
	vs, _, err := ms.ListVersions(a, st.ID, store.MemoryVersionListOptions{MemoryID: m.ID})
	if err != nil || len(vs) != 2 || vs[0].Operation != store.MemoryModified || vs[0].CreatedBy != sess ||
		vs[1].Operation != store.MemoryCreated || vs[1].CreatedBy != key || *vs[1].Content != "first" {
		t.Fatalf("versions = %+v, %v", vs, err)
	}
	if bySession, _, err := ms.ListVersions(a, st.ID, store.MemoryVersionListOptions{Actor: &sess}); err != nil || len(bySession) != 1 || bySession[0].ID != m2.VersionID {
		t.Fatalf("versions by the session = %+v, %v", bySession, err)
	}

	// Redaction: content and path gone, the record stays; the current
	// version cannot be redacted.
	if _, err := ms.RedactVersion(a, st.ID, m2.VersionID, key); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("redacting the current version: %v, want a failed precondition", err)
	}
	red, err := ms.RedactVersion(a, st.ID, m.VersionID, key)
	if err != nil || red.Content != nil || red.Path != nil || red.SHA256 != nil || red.SizeBytes != nil || red.RedactedAt == nil ||
		red.RedactedBy == nil || *red.RedactedBy != key || red.Operation != store.MemoryCreated || red.CreatedBy != key {
		t.Fatalf("redacted = %+v, %v", red, err)
	}
	if got, err := ms.GetVersion(a, st.ID, m.VersionID); err != nil || got.Content != nil || got.RedactedAt == nil {
		t.Fatalf("redacted version read back = %+v, %v", got, err)
	}
	var n int
	if err := queryRow(t, db.SuperuserURL, `SELECT count(*) FROM memory_versions WHERE content = 'first'`, &n); err != nil || n != 0 {
		t.Fatalf("redacted content still stored: %d rows, %v", n, err)
	}

	// Paths: pages in byte order, a prefix, a roll-up of directories.
	for _, p := range []string{"/a/two.md", "/a/b/deep.md", "/a/b/c/deeper.md", "/a0.md", "/z.md"} {
		if _, err := ms.CreateMemory(a, st.ID, p, p, key); err != nil {
			t.Fatal(err)
		}
	}
	var all []string
	from := ""
	for range 10 {
		items, next, err := ms.ListMemories(a, st.ID, store.MemoryListOptions{Limit: 2, From: from})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			all = append(all, it.Memory.Path)
		}
		if from = next; from == "" {
			break
		}
	}
	if strings.Join(all, " ") != "/a/b/c/deeper.md /a/b/deep.md /a/one.md /a/two.md /a0.md /z.md" {
		t.Fatalf("paged listing = %v", all)
	}
	items, next, err := ms.ListMemories(a, st.ID, store.MemoryListOptions{Prefix: "/a/", Depth: 1})
	if err != nil || next != "" || len(items) != 3 || items[0].Prefix != "/a/b/" || items[1].Memory.Path != "/a/one.md" || items[2].Memory.Path != "/a/two.md" {
		t.Fatalf("depth 1 under /a/ = %+v, %q, %v", items, next, err)
	}
	items, _, err = ms.ListMemories(a, st.ID, store.MemoryListOptions{Depth: 1})
	if err != nil || len(items) != 3 || items[0].Prefix != "/a/" || items[1].Memory.Path != "/a0.md" || items[2].Memory.Path != "/z.md" {
		t.Fatalf("depth 1 = %+v, %v", items, err)
	}

	// Bounds: a memory past 100 kB is refused.
	if _, err := ms.CreateMemory(a, st.ID, "/big.md", strings.Repeat("x", store.MaxMemoryBytes+1), key); errdefs.KindOf(err) != errdefs.TooLargeKind {
		t.Fatalf("a memory past the bound: %v", err)
	}

	// Tenant B sees nothing of A's.
	if _, err := ms.Get(b, st.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("B gets A's store: %v", err)
	}
	if _, err := ms.GetMemory(b, st.ID, m.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("B gets A's memory: %v", err)
	}
	if _, err := ms.CreateMemory(b, st.ID, "/x.md", "x", key); !errdefs.IsNotFound(err) {
		t.Fatalf("B writes to A's store: %v", err)
	}
	if l, _, err := ms.List(b, store.MemoryStoreListOptions{}); err != nil || len(l) != 0 {
		t.Fatalf("B lists %d stores, %v", len(l), err)
	}
	if _, _, err := ms.ListVersions(b, st.ID, store.MemoryVersionListOptions{}); !errdefs.IsNotFound(err) {
		t.Fatalf("B lists A's versions: %v", err)
	}

	// Archive makes the store read-only; delete takes everything.
	if _, err := ms.Archive(a, st.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := ms.CreateMemory(a, st.ID, "/late.md", "x", key); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a write to an archived store: %v", err)
	}
	if err := ms.Delete(a, st.ID); err != nil {
		t.Fatal(err)
	}
	if err := queryRow(t, db.SuperuserURL, `SELECT count(*) FROM memory_versions`, &n); err != nil || n != 0 {
		t.Fatalf("versions left after delete: %d, %v", n, err)
	}
}

// queryRow scans one row of sql, run at url, into dest.
func queryRow(t *testing.T, url, sql string, dest ...any) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// Writers racing from the same base: the store's lock makes them take
// turns, so exactly one update with a given precondition applies and the
// others are conflicts; none is lost silently.
func TestMemoryPreconditionUnderRace(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := tenant.With(context.Background(), tenant.Default)
	ms := s.MemoryStores()
	st, err := ms.Create(ctx, store.MemoryStore{Name: "race"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ms.CreateMemory(ctx, st.ID, "/n.md", "base", store.Actor{Type: store.ActorAPI, ID: "k"})
	if err != nil {
		t.Fatal(err)
	}
	const writers = 8
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			c := fmt.Sprintf("writer %d", i)
			_, err := ms.UpdateMemory(ctx, st.ID, m.ID, store.MemoryUpdate{Content: &c, ExpectSHA256: m.SHA256}, store.Actor{Type: store.ActorSession, ID: fmt.Sprintf("sesn_%d", i)})
			errs <- err
		}()
	}
	won, lost := 0, 0
	for range writers {
		switch err := <-errs; {
		case err == nil:
			won++
		case errdefs.IsConflict(err):
			lost++
		default:
			t.Fatal(err)
		}
	}
	vs, _, err := ms.ListVersions(ctx, st.ID, store.MemoryVersionListOptions{MemoryID: m.ID})
	if won != 1 || lost != writers-1 || err != nil || len(vs) != 2 {
		t.Fatalf("%d won, %d lost, %d versions (%v); want 1, %d, 2", won, lost, len(vs), err, writers-1)
	}
}
