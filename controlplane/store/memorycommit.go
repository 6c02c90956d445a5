package store

import (
	"context"
	"fmt"
	"unicode/utf8"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
)

// A sandbox's writes to a read_write memory store come back as changes
// against what the session saw: each names the sha256 of the content the
// session started from (its base). Commit applies a change only while the
// memory still has that base; otherwise another writer changed it since,
// and the change is a conflict, which is never applied over the other
// write: both are kept (the session's content goes to a conflict path
// beside it) and the conflict is reported to the caller, who tells the
// session.
//
// The fleet calls it after each tool step of a session with read_write
// stores (fleet.Mounts.CommitMemory), with the changes it read back from
// the sandbox's mount.

// MemoryChange is one path a session changed in a mounted store.
type MemoryChange struct {
	Path string
	// Content is the new content; nil when the session removed the file.
	Content *string
	// BaseSHA256 is the content_sha256 the session saw at Path ("" when
	// there was no memory there).
	BaseSHA256 string
}

// Bounds of one commit: what one tool step may write back.
const (
	MaxCommitChanges = 100
	MaxCommitBytes   = 4 << 20
)

// MemoryCommit is what a commit did: the versions it wrote, in the order
// of the changes, and the changes it could not apply.
type MemoryCommit struct {
	Versions  []MemoryVersion
	Conflicts []MemoryConflict
}

// MemoryConflict is a change that was not applied as the session made it.
type MemoryConflict struct {
	Path string
	// Reason says what happened, for the session's event.
	Reason string
	// KeptAt is the path the session's content was written to instead
	// ("" when nothing was kept: a removal, or a refused write).
	KeptAt string
}

// conflictPath is where a session's conflicting content is kept: beside
// the memory, named after the session, so that a second conflict of the
// same session replaces the first rather than piling up.
func conflictPath(path, sessionID string) string {
	return fmt.Sprintf("%s.conflict-%s", path, sessionID)
}

// Commit applies a session's changes to store storeID in one transaction
// under the store's lock, as actor (a session_actor). A write past the
// store's bounds is refused and reported as a conflict; the other changes
// still apply. A store that is archived or gone fails the whole commit.
func (r MemoryStores) Commit(ctx context.Context, storeID string, changes []MemoryChange, actor Actor) (MemoryCommit, error) {
	if len(changes) > MaxCommitChanges {
		return MemoryCommit{}, errdefs.ResourceExhausted("a commit of %d memory changes; at most %d are allowed", len(changes), MaxCommitChanges)
	}
	total := 0
	for _, c := range changes {
		if c.Content != nil {
			total += len(*c.Content)
		}
	}
	if total > MaxCommitBytes {
		return MemoryCommit{}, errdefs.ResourceExhausted("a commit of %d bytes of memories; at most %d are allowed", total, MaxCommitBytes)
	}
	var out MemoryCommit
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		out = MemoryCommit{}
		if _, err := lockStore(ctx, q, tid, storeID); err != nil {
			return err
		}
		for _, c := range changes {
			v, conflict, err := commitOne(ctx, q, tid, storeID, c, actor)
			if err != nil {
				return err
			}
			if v != nil {
				out.Versions = append(out.Versions, *v)
			}
			if conflict != nil {
				out.Conflicts = append(out.Conflicts, *conflict)
			}
		}
		return nil
	})
	return out, err
}

// commitOne applies one change; an error fails the commit, a conflict
// does not.
func commitOne(ctx context.Context, q *db.Queries, tid, storeID string, c MemoryChange, actor Actor) (*MemoryVersion, *MemoryConflict, error) {
	if err := CheckMemoryPath(c.Path, "the memory path"); err != nil {
		return nil, &MemoryConflict{Path: c.Path, Reason: err.Error() + "; not saved"}, nil
	}
	if c.Content != nil && !utf8.ValidString(*c.Content) {
		return nil, &MemoryConflict{Path: c.Path, Reason: "a memory is UTF-8 text, and this file is not; not saved"}, nil
	}
	row, err := q.MemoryByPath(ctx, db.MemoryByPathParams{TenantID: tid, StoreID: storeID, Path: c.Path})
	exists := err == nil
	if err != nil && !errdefs.IsNotFound(translate(err, "memory")) {
		return nil, nil, translate(err, "memory "+c.Path)
	}
	cur := memoryFromRow(row)
	refused := func(err error) (*MemoryVersion, *MemoryConflict, error) {
		if k := errdefs.KindOf(err); k == errdefs.TooLargeKind || k == errdefs.ResourceExhaustedKind || k == errdefs.ConflictKind {
			return nil, &MemoryConflict{Path: c.Path, Reason: err.Error()}, nil
		}
		return nil, nil, err
	}
	written := func(m Memory) (*MemoryVersion, *MemoryConflict, error) {
		v, err := q.GetMemoryVersion(ctx, db.GetMemoryVersionParams{TenantID: tid, StoreID: storeID, ID: m.VersionID})
		if err != nil {
			return nil, nil, translate(err, "memory version "+m.VersionID)
		}
		out := versionFromRow(v)
		return &out, nil, nil
	}
	if c.Content == nil { // removed in the sandbox
		switch {
		case !exists:
			return nil, nil, nil // gone already
		case cur.SHA256 != c.BaseSHA256:
			return nil, &MemoryConflict{Path: c.Path, Reason: "the session removed a memory that another writer changed since; the other writer's content is kept"}, nil
		}
		if err := deleteMemory(ctx, q, tid, cur, c.BaseSHA256, actor); err != nil {
			return refused(err)
		}
		v, err := q.ListMemoryVersions(ctx, db.ListMemoryVersionsParams{TenantID: tid, StoreID: storeID, MemoryID: cur.ID, Operation: MemoryDeleted, Lim: 1})
		if err != nil || len(v) == 0 {
			return nil, nil, translate(err, "memory version")
		}
		out := versionFromRow(v[0])
		return &out, nil, nil
	}
	content := *c.Content
	switch {
	case exists && cur.SHA256 == ContentSHA256(content):
		return nil, nil, nil // the same content: nothing to write
	case !exists && c.BaseSHA256 == "":
		m, err := createMemory(ctx, q, tid, storeID, c.Path, content, actor)
		if err != nil {
			return refused(err)
		}
		return written(m)
	case exists && cur.SHA256 == c.BaseSHA256:
		m, err := updateMemory(ctx, q, tid, cur, MemoryUpdate{Content: &content, ExpectSHA256: c.BaseSHA256}, actor)
		if err != nil {
			return refused(err)
		}
		return written(m)
	}
	// Another writer created, changed or removed the memory since the
	// session saw it: keep theirs at the path and the session's beside it.
	reason := "another writer changed this memory since the session read it"
	switch {
	case !exists:
		reason = "another writer removed this memory since the session read it"
	case c.BaseSHA256 == "":
		reason = "another writer created a memory at this path since the session read the store"
	}
	kept := conflictPath(c.Path, actor.ID)
	if len(kept) > 1024 {
		return nil, &MemoryConflict{Path: c.Path, Reason: reason + "; the session's content was not kept (its conflict path would be too long)"}, nil
	}
	var m Memory
	if other, err := q.MemoryByPath(ctx, db.MemoryByPathParams{TenantID: tid, StoreID: storeID, Path: kept}); err == nil {
		m, err = updateMemory(ctx, q, tid, memoryFromRow(other), MemoryUpdate{Content: &content}, actor)
		if err != nil {
			return refused(err)
		}
	} else if errdefs.IsNotFound(translate(err, "memory")) {
		if m, err = createMemory(ctx, q, tid, storeID, kept, content, actor); err != nil {
			return refused(err)
		}
	} else {
		return nil, nil, translate(err, "memory "+kept)
	}
	v, _, err := written(m)
	if err != nil {
		return nil, nil, err
	}
	return v, &MemoryConflict{Path: c.Path, Reason: reason + "; both are kept: the session's content is at " + kept, KeptAt: kept}, nil
}
