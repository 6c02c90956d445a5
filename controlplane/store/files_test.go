package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

func newFile(t *testing.T, s *store.Store, ctx context.Context, name string, size, quota int64) (store.File, error) {
	t.Helper()
	id := store.NewFileID()
	tid, err := tenant.Required(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s.Files().Create(ctx, store.File{ID: id, Filename: name, MimeType: "text/csv", SizeBytes: size, Downloadable: true,
		BlobKey: store.FileBlobKey(string(tid), id)}, quota)
}

// Files: create, get, list in pages both ways and by scope and ids,
// delete; tenant B sees none of A's, through the store or through SQL
// that names A outright.
func TestFiles(t *testing.T) {
	db := pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s := open(t, db.AppURL)
	a := tenant.With(context.Background(), tenant.Default)
	b := tenant.With(context.Background(), "tenant_b")

	var ids []string // oldest first
	for i := range 5 {
		f, err := newFile(t, s, a, "f.csv", int64(10+i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if f.ID == "" || f.CreatedAt.IsZero() || f.BlobKey != "files/tenant_default/"+f.ID || f.ScopeID != "" || !f.Downloadable {
			t.Fatalf("created %+v", f)
		}
		ids = append(ids, f.ID)
	}
	scoped, err := s.Files().Create(a, store.File{ID: store.NewFileID(), Filename: "out.txt", MimeType: "text/plain", SizeBytes: 1,
		ScopeID: "sesn_1", BlobKey: "files/tenant_default/x"}, 0)
	if err != nil {
		t.Fatal(err)
	}

	got, err := s.Files().Get(a, ids[0])
	if err != nil || got.Filename != "f.csv" || got.SizeBytes != 10 || got.MimeType != "text/csv" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if used, err := s.Files().Used(a); err != nil || used != 10+11+12+13+14+1 {
		t.Fatalf("Used = %d, %v", used, err)
	}

	// Pages of two, newest first, then back from the last page.
	p1, more, err := s.Files().List(a, store.FileListOptions{Limit: 2})
	if err != nil || !more || len(p1) != 2 || p1[0].ID != scoped.ID || p1[1].ID != ids[4] {
		t.Fatalf("page 1 = %v, %v, %v", fileIDs(p1), more, err)
	}
	last := p1[1]
	p2, more, err := s.Files().List(a, store.FileListOptions{Limit: 2, After: &store.Key{CreatedAt: last.CreatedAt, ID: last.ID}})
	if err != nil || !more || len(p2) != 2 || p2[0].ID != ids[3] || p2[1].ID != ids[2] {
		t.Fatalf("page 2 = %v, %v, %v", fileIDs(p2), more, err)
	}
	back, more, err := s.Files().List(a, store.FileListOptions{Limit: 2, Before: &store.Key{CreatedAt: p2[0].CreatedAt, ID: p2[0].ID}})
	if err != nil || more || len(back) != 2 || back[0].ID != scoped.ID || back[1].ID != ids[4] {
		t.Fatalf("page before page 2 = %v, %v, %v", fileIDs(back), more, err)
	}
	if l, _, err := s.Files().List(a, store.FileListOptions{ScopeID: "sesn_1"}); err != nil || len(l) != 1 || l[0].ID != scoped.ID || l[0].ScopeID != "sesn_1" {
		t.Fatalf("scope sesn_1 = %v, %v", fileIDs(l), err)
	}
	if l, _, err := s.Files().List(a, store.FileListOptions{IDs: []string{ids[1], ids[3], "file_nothing"}}); err != nil || len(l) != 2 || l[0].ID != ids[3] {
		t.Fatalf("ids = %v, %v", fileIDs(l), err)
	}

	// Tenant B: nothing of A's.
	if l, _, err := s.Files().List(b, store.FileListOptions{}); err != nil || len(l) != 0 {
		t.Fatalf("B lists %v, %v", fileIDs(l), err)
	}
	if _, err := s.Files().Get(b, ids[0]); !errdefs.IsNotFound(err) {
		t.Fatalf("B Get(A's file): %v", err)
	}
	if _, err := s.Files().Delete(b, ids[0]); !errdefs.IsNotFound(err) {
		t.Fatalf("B Delete(A's file): %v", err)
	}
	if used, err := s.Files().Used(b); err != nil || used != 0 {
		t.Fatalf("B Used = %d, %v", used, err)
	}
	ctx := context.Background()
	app, err := pgx.Connect(ctx, db.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	var n int
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('corral.tenant_id', 'tenant_b', true)`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM files WHERE tenant_id = 'tenant_default'`).Scan(&n)
	})
	if err != nil || n != 0 {
		t.Fatalf("tenant B's SQL counted %d of A's files: %v", n, err)
	}
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('corral.tenant_id', 'tenant_b', true)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO files (tenant_id, id, filename, mime_type, size_bytes, downloadable, blob_key) VALUES ('tenant_default', 'file_x', 'x', 'x', 1, true, 'x')`)
		return err
	})
	if err == nil {
		t.Fatal("tenant B inserted a file of the default tenant")
	}

	// Delete returns the row (the caller then deletes the blob); a second
	// delete is not found.
	d, err := s.Files().Delete(a, ids[0])
	if err != nil || d.ID != ids[0] || d.BlobKey != "files/tenant_default/"+ids[0] {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	if _, err := s.Files().Get(a, ids[0]); !errdefs.IsNotFound(err) {
		t.Fatalf("Get after delete: %v", err)
	}
	if _, err := s.Files().Delete(a, ids[0]); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
}

// The storage quota holds under concurrent creates: of ten files of 30
// bytes against a 100-byte quota, exactly three are stored.
func TestFileQuota(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	a := tenant.With(context.Background(), tenant.Default)
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() { _, errs[i] = newFile(t, s, a, "x", 30, 100) })
	}
	wg.Wait()
	stored := 0
	for _, err := range errs {
		switch {
		case err == nil:
			stored++
		case errdefs.KindOf(err) != errdefs.ResourceExhaustedKind:
			t.Fatalf("refusal of kind %v: %v", errdefs.KindOf(err), err)
		}
	}
	if used, err := s.Files().Used(a); stored != 3 || err != nil || used != 90 {
		t.Fatalf("stored %d files, %d bytes (%v); want 3 and 90", stored, used, err)
	}
	// A file exactly filling the quota fits.
	if _, err := newFile(t, s, a, "x", 10, 100); err != nil {
		t.Fatalf("a file filling the quota: %v", err)
	}
}

func fileIDs(fs []store.File) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.ID)
	}
	return out
}

// A session's outputs: Replace records a new file and drops the one it
// replaces in one transaction, within the quota counted without the
// replaced bytes; Scope lists the session's files oldest first, with
// their content hashes; another tenant's Scope is empty.
func TestFilesReplaceAndScope(t *testing.T) {
	db := pgtest.New(t)
	exec(t, db.SuperuserURL, `INSERT INTO tenants (id, name) VALUES ('tenant_b', 'b')`)
	s := open(t, db.AppURL)
	a := tenant.With(context.Background(), tenant.Default)
	b := tenant.With(context.Background(), "tenant_b")
	out := func(name string, size int64, sum string) store.File {
		id := store.NewFileID()
		return store.File{ID: id, Filename: name, MimeType: "text/plain", SizeBytes: size, Downloadable: true, ScopeID: "sesn_1",
			BlobKey: store.FileBlobKey(string(tenant.Default), id), SHA256: sum}
	}
	sumA, sumB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	first, old, err := s.Files().Replace(a, out("r.txt", 60, sumA), "", 100)
	if err != nil || old != nil || first.SHA256 != sumA || first.ScopeID != "sesn_1" {
		t.Fatalf("first output: %+v %v %v", first, old, err)
	}
	// 60 stored, quota 100: a 90-byte replacement fits once the 60 go.
	second, old, err := s.Files().Replace(a, out("r.txt", 90, sumB), first.ID, 100)
	if err != nil || old == nil || old.ID != first.ID || old.BlobKey != first.BlobKey {
		t.Fatalf("replacing: %+v %+v %v", second, old, err)
	}
	if _, err := s.Files().Get(a, first.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("the replaced file: %v", err)
	}
	// Over the quota: refused, and the file it would replace stays.
	if _, _, err := s.Files().Replace(a, out("r.txt", 101, sumA), second.ID, 100); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Fatalf("over quota: %v", err)
	}
	if _, err := s.Files().Get(a, second.ID); err != nil {
		t.Fatalf("a refused replacement removed its file: %v", err)
	}
	if _, _, err := s.Files().Replace(a, out("other.txt", 1, sumA), "file_gone", 0); err != nil {
		t.Fatalf("replacing a file gone already: %v", err)
	}
	fs, err := s.Files().Scope(a, "sesn_1")
	if err != nil || len(fs) != 2 || fs[0].ID != second.ID || fs[0].SHA256 != sumB || fs[1].Filename != "other.txt" {
		t.Fatalf("Scope = %+v, %v", fs, err)
	}
	if fs, err := s.Files().Scope(b, "sesn_1"); err != nil || len(fs) != 0 {
		t.Fatalf("tenant B's Scope = %+v, %v", fs, err)
	}
}
