package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
	"golang.org/x/text/unicode/norm"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// ID prefixes of memory stores, memories and memory versions, as the
// Managed Agents API has them.
const (
	MemoryStoreIDPrefix   = "memstore_"
	MemoryIDPrefix        = "mem_"
	MemoryVersionIDPrefix = "memver_"
)

// Bounds of memory stores. A memory's bound is the API's (100 kB); a
// store's bounds keep a sandbox's mount of it (every memory, copied in)
// small and quick.
const (
	MaxMemoryPath       = 1024
	MaxMemorySegments   = 20
	MaxMemoryBytes      = 102_400
	MaxMemoriesPerStore = 2_000
	MaxStoreBytes       = 20 << 20
)

// Memory version operations.
const (
	MemoryCreated  = "created"
	MemoryModified = "modified"
	MemoryDeleted  = "deleted"
)

// Actor types: who wrote a memory version (or redacted it).
const (
	ActorAPI            = "api_actor"
	ActorUser           = "user_actor"
	ActorServiceAccount = "service_account_actor"
	ActorSession        = "session_actor"
)

// Actor is who made a change: an API key, a user or service principal,
// or a session (its agent, writing through the store's mount).
type Actor struct {
	Type string
	ID   string
}

// MemoryStore is a tenant's named collection of memories.
type MemoryStore struct {
	ID          string
	Name        string
	Description string
	Metadata    map[string]string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ArchivedAt  *time.Time
}

// Memory is a text document at a path in a store.
type Memory struct {
	ID        string
	StoreID   string
	Path      string
	Content   string
	SHA256    string
	SizeBytes int64
	// VersionID is the version that holds the current content.
	VersionID string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// MemoryVersion is one write of a memory. A redacted version has no
// path, content, size or sha256 (nil).
type MemoryVersion struct {
	ID         string
	StoreID    string
	MemoryID   string
	Operation  string
	Path       *string
	Content    *string
	SHA256     *string
	SizeBytes  *int64
	CreatedBy  Actor
	CreatedAt  time.Time
	RedactedAt *time.Time
	RedactedBy *Actor
}

// MemoryStoreListOptions filter and page MemoryStores.List.
type MemoryStoreListOptions struct {
	Limit           int
	IncludeArchived bool
	CreatedGte      *time.Time
	CreatedLte      *time.Time
	After           *Key
}

// MemoryVersionListOptions filter and page MemoryStores.ListVersions.
type MemoryVersionListOptions struct {
	Limit      int
	MemoryID   string
	Operation  string
	Actor      *Actor
	CreatedGte *time.Time
	CreatedLte *time.Time
	After      *Key
}

// MemoryUpdate is a change to a memory: a new path, new content, or
// both; with ExpectSHA256 set, it applies only while the memory's content
// still has that sha256.
type MemoryUpdate struct {
	Path         *string
	Content      *string
	ExpectSHA256 string
}

// ContentSHA256 is the hex SHA-256 of a memory's content, as the API
// reports it (no normalization).
func ContentSHA256(content string) string {
	h := sha256.Sum256([]byte(content))
	return hex.EncodeToString(h[:])
}

// MemoryStores is the repository of memory stores, their memories and
// versions.
type MemoryStores struct{ s *Store }

// MemoryStores returns the memory store repository.
func (s *Store) MemoryStores() MemoryStores { return MemoryStores{s} }

// Create records a new store; it picks the id.
func (r MemoryStores) Create(ctx context.Context, m MemoryStore) (MemoryStore, error) {
	var out MemoryStore
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.CreateMemoryStore(ctx, db.CreateMemoryStoreParams{TenantID: tid, ID: newID(MemoryStoreIDPrefix),
			Name: m.Name, Description: m.Description, Metadata: marshalMetadata(m.Metadata)})
		if err != nil {
			return translate(err, "memory store")
		}
		out, err = memoryStoreFromRow(row)
		return err
	})
	return out, err
}

// Get returns store id.
func (r MemoryStores) Get(ctx context.Context, id string) (MemoryStore, error) {
	var out MemoryStore
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetMemoryStore(ctx, db.GetMemoryStoreParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "memory store "+id)
		}
		out, err = memoryStoreFromRow(row)
		return err
	})
	return out, err
}

// Update applies apply to store id under its row lock. An archived store
// cannot change.
func (r MemoryStores) Update(ctx context.Context, id string, apply func(cur MemoryStore) (MemoryStore, error)) (MemoryStore, error) {
	var out MemoryStore
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		cur, err := lockStore(ctx, q, tid, id)
		if err != nil {
			return err
		}
		next, err := apply(cur)
		if err != nil {
			return err
		}
		row, err := q.UpdateMemoryStore(ctx, db.UpdateMemoryStoreParams{TenantID: tid, ID: id, Name: next.Name,
			Description: next.Description, Metadata: marshalMetadata(next.Metadata)})
		if err != nil {
			return translate(err, "memory store "+id)
		}
		out, err = memoryStoreFromRow(row)
		return err
	})
	return out, err
}

// Archive makes store id read-only: its memories stay readable, and no
// new session can mount it. Archiving twice is a no-op.
func (r MemoryStores) Archive(ctx context.Context, id string) (MemoryStore, error) {
	var out MemoryStore
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.ArchiveMemoryStore(ctx, db.ArchiveMemoryStoreParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "memory store "+id)
		}
		out, err = memoryStoreFromRow(row)
		return err
	})
	return out, err
}

// Delete removes store id with its memories and versions.
func (r MemoryStores) Delete(ctx context.Context, id string) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		_, err := q.DeleteMemoryStore(ctx, db.DeleteMemoryStoreParams{TenantID: tid, ID: id})
		return translate(err, "memory store "+id)
	})
}

// List returns a page of the tenant's stores, newest first, and whether
// more follow.
func (r MemoryStores) List(ctx context.Context, opts MemoryStoreListOptions) ([]MemoryStore, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.After)
	var out []MemoryStore
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListMemoryStores(ctx, db.ListMemoryStoresParams{TenantID: tid, IncludeArchived: opts.IncludeArchived,
			CreatedGte: ts(opts.CreatedGte), CreatedLte: ts(opts.CreatedLte), BeforeCreated: kc, BeforeID: kid, Lim: lim})
		if err != nil {
			return translate(err, "memory stores")
		}
		for _, row := range rows {
			m, err := memoryStoreFromRow(row)
			if err != nil {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	more := len(out) > n
	if more {
		out = out[:n]
	}
	return out, more, nil
}

// lockStore locks store id for a write and refuses an archived one.
func lockStore(ctx context.Context, q *db.Queries, tid, id string) (MemoryStore, error) {
	row, err := q.LockMemoryStore(ctx, db.LockMemoryStoreParams{TenantID: tid, ID: id})
	if err != nil {
		return MemoryStore{}, translate(err, "memory store "+id)
	}
	m, err := memoryStoreFromRow(row)
	if err != nil {
		return MemoryStore{}, err
	}
	if m.ArchivedAt != nil {
		return MemoryStore{}, errdefs.FailedPrecondition("memory store %s is archived and cannot be changed", id)
	}
	return m, nil
}

// checkUsage refuses a write that would take the store past its bounds:
// more memories more (0 or 1) and a change of bytes delta.
func checkUsage(ctx context.Context, q *db.Queries, tid, storeID string, more, delta int64) error {
	u, err := q.MemoryStoreUsage(ctx, db.MemoryStoreUsageParams{TenantID: tid, StoreID: storeID})
	if err != nil {
		return translate(err, "memory store "+storeID)
	}
	if more > 0 && u.N+more > MaxMemoriesPerStore {
		return errdefs.ResourceExhausted("memory store %s holds %d memories; at most %d are allowed", storeID, u.N, MaxMemoriesPerStore)
	}
	if delta > 0 && u.Bytes+delta > MaxStoreBytes {
		return errdefs.ResourceExhausted("memory store %s holds %d bytes of memories; this write would take it past its limit of %d bytes", storeID, u.Bytes, MaxStoreBytes)
	}
	return nil
}

// CreateMemory writes a new memory at path, recording its created version
// by actor. A memory already at path is a conflict (409).
func (r MemoryStores) CreateMemory(ctx context.Context, storeID, path, content string, actor Actor) (Memory, error) {
	var out Memory
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := lockStore(ctx, q, tid, storeID); err != nil {
			return err
		}
		var err error
		out, err = createMemory(ctx, q, tid, storeID, path, content, actor)
		return err
	})
	return out, err
}

func createMemory(ctx context.Context, q *db.Queries, tid, storeID, path, content string, actor Actor) (Memory, error) {
	if len(content) > MaxMemoryBytes {
		return Memory{}, errdefs.TooLarge("memory %s: content is %d bytes; at most %d are allowed", path, len(content), MaxMemoryBytes)
	}
	if _, err := q.MemoryByPath(ctx, db.MemoryByPathParams{TenantID: tid, StoreID: storeID, Path: path}); err == nil {
		return Memory{}, errdefs.Conflict("memory store %s already has a memory at %s", storeID, path)
	} else if !errdefs.IsNotFound(translate(err, "memory")) {
		return Memory{}, translate(err, "memory "+path)
	}
	if err := checkUsage(ctx, q, tid, storeID, 1, int64(len(content))); err != nil {
		return Memory{}, err
	}
	id, sum := newID(MemoryIDPrefix), ContentSHA256(content)
	v, err := addVersion(ctx, q, tid, storeID, id, MemoryCreated, &path, &content, sum, actor)
	if err != nil {
		return Memory{}, err
	}
	row, err := q.CreateMemory(ctx, db.CreateMemoryParams{TenantID: tid, StoreID: storeID, ID: id, Path: path, Content: content,
		ContentSha256: sum, SizeBytes: int64(len(content)), MemoryVersionID: v.ID})
	if err != nil {
		return Memory{}, translate(err, "memory "+path)
	}
	return memoryFromRow(row), nil
}

func addVersion(ctx context.Context, q *db.Queries, tid, storeID, memoryID, op string, path, content *string, sum string, actor Actor) (db.MemoryVersion, error) {
	p := db.CreateMemoryVersionParams{TenantID: tid, StoreID: storeID, ID: newID(MemoryVersionIDPrefix), MemoryID: memoryID,
		Operation: op, ActorType: actor.Type, ActorID: actor.ID}
	if path != nil {
		p.Path = pgtype.Text{String: *path, Valid: true}
	}
	if content != nil {
		p.Content = pgtype.Text{String: *content, Valid: true}
		p.ContentSha256 = pgtype.Text{String: sum, Valid: true}
		p.SizeBytes = pgtype.Int8{Int64: int64(len(*content)), Valid: true}
	}
	row, err := q.CreateMemoryVersion(ctx, p)
	return row, translate(err, "memory version")
}

// GetMemory returns memory id of store storeID.
func (r MemoryStores) GetMemory(ctx context.Context, storeID, id string) (Memory, error) {
	var out Memory
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetMemory(ctx, db.GetMemoryParams{TenantID: tid, StoreID: storeID, ID: id})
		if err != nil {
			if _, serr := q.GetMemoryStore(ctx, db.GetMemoryStoreParams{TenantID: tid, ID: storeID}); serr != nil {
				return translate(serr, "memory store "+storeID)
			}
			return translate(err, "memory "+id)
		}
		out = memoryFromRow(row)
		return nil
	})
	return out, err
}

// preconditionError is a content_sha256 precondition that did not hold.
func preconditionError(id, want, have string) error {
	return errdefs.Conflict("memory %s: content_sha256 precondition failed: expected %s, the memory's content is now %s; read it again and retry", id, want, have)
}

// UpdateMemory changes memory id, recording a modified version by actor.
// A failed precondition is a conflict (409) and changes nothing; so is a
// path that another memory has. A change that changes nothing records
// nothing.
func (r MemoryStores) UpdateMemory(ctx context.Context, storeID, id string, u MemoryUpdate, actor Actor) (Memory, error) {
	var out Memory
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := lockStore(ctx, q, tid, storeID); err != nil {
			return err
		}
		row, err := q.LockMemory(ctx, db.LockMemoryParams{TenantID: tid, StoreID: storeID, ID: id})
		if err != nil {
			return translate(err, "memory "+id)
		}
		out, err = updateMemory(ctx, q, tid, memoryFromRow(row), u, actor)
		return err
	})
	return out, err
}

func updateMemory(ctx context.Context, q *db.Queries, tid string, cur Memory, u MemoryUpdate, actor Actor) (Memory, error) {
	if u.ExpectSHA256 != "" && u.ExpectSHA256 != cur.SHA256 {
		return Memory{}, preconditionError(cur.ID, u.ExpectSHA256, cur.SHA256)
	}
	path, content := cur.Path, cur.Content
	if u.Path != nil {
		path = *u.Path
	}
	if u.Content != nil {
		content = *u.Content
	}
	if path == cur.Path && content == cur.Content {
		return cur, nil
	}
	if len(content) > MaxMemoryBytes {
		return Memory{}, errdefs.TooLarge("memory %s: content is %d bytes; at most %d are allowed", path, len(content), MaxMemoryBytes)
	}
	if path != cur.Path {
		if _, err := q.MemoryByPath(ctx, db.MemoryByPathParams{TenantID: tid, StoreID: cur.StoreID, Path: path}); err == nil {
			return Memory{}, errdefs.Conflict("memory store %s already has a memory at %s", cur.StoreID, path)
		} else if !errdefs.IsNotFound(translate(err, "memory")) {
			return Memory{}, translate(err, "memory "+path)
		}
	}
	if err := checkUsage(ctx, q, tid, cur.StoreID, 0, int64(len(content))-cur.SizeBytes); err != nil {
		return Memory{}, err
	}
	sum := ContentSHA256(content)
	v, err := addVersion(ctx, q, tid, cur.StoreID, cur.ID, MemoryModified, &path, &content, sum, actor)
	if err != nil {
		return Memory{}, err
	}
	row, err := q.UpdateMemory(ctx, db.UpdateMemoryParams{TenantID: tid, StoreID: cur.StoreID, ID: cur.ID, Path: path, Content: content,
		ContentSha256: sum, SizeBytes: int64(len(content)), MemoryVersionID: v.ID})
	if err != nil {
		return Memory{}, translate(err, "memory "+cur.ID)
	}
	return memoryFromRow(row), nil
}

// DeleteMemory removes memory id, recording a deleted version by actor;
// with expectSHA256 set, only while its content still has that sha256
// (otherwise a conflict, 409, and nothing is deleted).
func (r MemoryStores) DeleteMemory(ctx context.Context, storeID, id, expectSHA256 string, actor Actor) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := lockStore(ctx, q, tid, storeID); err != nil {
			return err
		}
		row, err := q.LockMemory(ctx, db.LockMemoryParams{TenantID: tid, StoreID: storeID, ID: id})
		if err != nil {
			return translate(err, "memory "+id)
		}
		return deleteMemory(ctx, q, tid, memoryFromRow(row), expectSHA256, actor)
	})
}

func deleteMemory(ctx context.Context, q *db.Queries, tid string, cur Memory, expectSHA256 string, actor Actor) error {
	if expectSHA256 != "" && expectSHA256 != cur.SHA256 {
		return preconditionError(cur.ID, expectSHA256, cur.SHA256)
	}
	if _, err := addVersion(ctx, q, tid, cur.StoreID, cur.ID, MemoryDeleted, &cur.Path, nil, "", actor); err != nil {
		return err
	}
	return translate(q.DeleteMemory(ctx, db.DeleteMemoryParams{TenantID: tid, StoreID: cur.StoreID, ID: cur.ID}), "memory "+cur.ID)
}

// MemoryListOptions page MemoryStores.ListMemories.
type MemoryListOptions struct {
	Limit int
	// Prefix keeps the memories whose path starts with it ("" or "/":
	// all); it ends with "/".
	Prefix string
	// Depth, above 0, lists only that many segments below Prefix: deeper
	// memories roll up into one prefix item per directory.
	Depth int
	// From continues a listing: the first path it may return.
	From string
}

// MemoryItem is a memory or, when Prefix is set, a rolled-up directory
// (its path ends with "/").
type MemoryItem struct {
	Memory *Memory
	Prefix string
}

// maxListQueries bounds the queries one page of a rolled-up listing
// makes: each prefix item costs one.
const maxListQueries = 200

// ListMemories returns a page of store storeID's memories in path order
// (byte-wise) and the From of the next page ("" at the end).
func (r MemoryStores) ListMemories(ctx context.Context, storeID string, opts MemoryListOptions) ([]MemoryItem, string, error) {
	n, _ := pageLimit(opts.Limit)
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "/"
	}
	from := opts.From
	var out []MemoryItem
	next := ""
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.GetMemoryStore(ctx, db.GetMemoryStoreParams{TenantID: tid, ID: storeID}); err != nil {
			return translate(err, "memory store "+storeID)
		}
		for range maxListQueries {
			rows, err := q.ListMemories(ctx, db.ListMemoriesParams{TenantID: tid, StoreID: storeID, Prefix: prefix, FromPath: from, Lim: int32(n - len(out) + 1)})
			if err != nil {
				return translate(err, "memories")
			}
			rolled := false
			for _, row := range rows {
				if len(out) == n {
					next = row.Path
					return nil
				}
				if opts.Depth > 0 {
					rest := strings.Split(row.Path[len(prefix):], "/")
					if len(rest) > opts.Depth {
						dir := prefix + strings.Join(rest[:opts.Depth], "/") + "/"
						out = append(out, MemoryItem{Prefix: dir})
						// Every path beneath dir sorts before dir
						// with its "/" made "0" (the next byte).
						from = dir[:len(dir)-1] + "0"
						rolled = true
						break
					}
				}
				m := memoryFromRow(row)
				out = append(out, MemoryItem{Memory: &m})
			}
			if !rolled {
				return nil
			}
		}
		if len(out) > 0 {
			next = from
		}
		return nil
	})
	return out, next, err
}

// AllMemories returns every memory of store storeID, in path order (a
// store has at most MaxMemoriesPerStore).
func (r MemoryStores) AllMemories(ctx context.Context, storeID string) ([]Memory, error) {
	var out []Memory
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.AllMemories(ctx, db.AllMemoriesParams{TenantID: tid, StoreID: storeID, Lim: MaxMemoriesPerStore})
		if err != nil {
			return translate(err, "memories")
		}
		for _, row := range rows {
			out = append(out, memoryFromRow(row))
		}
		return nil
	})
	return out, err
}

// GetVersion returns version id of store storeID.
func (r MemoryStores) GetVersion(ctx context.Context, storeID, id string) (MemoryVersion, error) {
	var out MemoryVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetMemoryVersion(ctx, db.GetMemoryVersionParams{TenantID: tid, StoreID: storeID, ID: id})
		if err != nil {
			return translate(err, "memory version "+id)
		}
		out = versionFromRow(row)
		return nil
	})
	return out, err
}

// RedactVersion removes version id's content and path; the record stays,
// with who redacted it and when. Redacting twice keeps the first. The
// version that holds a memory's current content cannot be redacted (the
// memory would have content no version has): update or delete the memory
// first.
func (r MemoryStores) RedactVersion(ctx context.Context, storeID, id string, by Actor) (MemoryVersion, error) {
	var out MemoryVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.LockMemoryStore(ctx, db.LockMemoryStoreParams{TenantID: tid, ID: storeID}); err != nil {
			return translate(err, "memory store "+storeID)
		}
		v, err := q.GetMemoryVersion(ctx, db.GetMemoryVersionParams{TenantID: tid, StoreID: storeID, ID: id})
		if err != nil {
			return translate(err, "memory version "+id)
		}
		if m, err := q.GetMemory(ctx, db.GetMemoryParams{TenantID: tid, StoreID: storeID, ID: v.MemoryID}); err == nil && m.MemoryVersionID == id {
			return errdefs.FailedPrecondition("memory version %s holds the current content of memory %s; update or delete the memory before redacting it", id, v.MemoryID)
		}
		row, err := q.RedactMemoryVersion(ctx, db.RedactMemoryVersionParams{TenantID: tid, StoreID: storeID, ID: id,
			RedactorType: pgtype.Text{String: by.Type, Valid: true}, RedactorID: pgtype.Text{String: by.ID, Valid: true}})
		if err != nil {
			return translate(err, "memory version "+id)
		}
		out = versionFromRow(row)
		return nil
	})
	return out, err
}

// ListVersions returns a page of store storeID's versions, newest first,
// and whether more follow.
func (r MemoryStores) ListVersions(ctx context.Context, storeID string, opts MemoryVersionListOptions) ([]MemoryVersion, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.After)
	p := db.ListMemoryVersionsParams{StoreID: storeID, MemoryID: opts.MemoryID, Operation: opts.Operation,
		CreatedGte: ts(opts.CreatedGte), CreatedLte: ts(opts.CreatedLte), BeforeCreated: kc, BeforeID: kid, Lim: lim}
	if opts.Actor != nil {
		p.ActorType, p.ActorID = opts.Actor.Type, opts.Actor.ID
	}
	var out []MemoryVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.GetMemoryStore(ctx, db.GetMemoryStoreParams{TenantID: tid, ID: storeID}); err != nil {
			return translate(err, "memory store "+storeID)
		}
		p.TenantID = tid
		rows, err := q.ListMemoryVersions(ctx, p)
		if err != nil {
			return translate(err, "memory versions")
		}
		for _, row := range rows {
			out = append(out, versionFromRow(row))
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	more := len(out) > n
	if more {
		out = out[:n]
	}
	return out, more, nil
}

func memoryStoreFromRow(row db.MemoryStore) (MemoryStore, error) {
	md, err := unmarshalMetadata(row.Metadata)
	if err != nil {
		return MemoryStore{}, err
	}
	return MemoryStore{ID: row.ID, Name: row.Name, Description: row.Description, Metadata: md,
		CreatedAt: row.CreatedAt.Time, UpdatedAt: row.UpdatedAt.Time, ArchivedAt: fromTS(row.ArchivedAt)}, nil
}

func memoryFromRow(row db.Memory) Memory {
	return Memory{ID: row.ID, StoreID: row.StoreID, Path: row.Path, Content: row.Content, SHA256: row.ContentSha256,
		SizeBytes: row.SizeBytes, VersionID: row.MemoryVersionID, CreatedAt: row.CreatedAt.Time, UpdatedAt: row.UpdatedAt.Time}
}

func versionFromRow(row db.MemoryVersion) MemoryVersion {
	v := MemoryVersion{ID: row.ID, StoreID: row.StoreID, MemoryID: row.MemoryID, Operation: row.Operation,
		CreatedBy: Actor{Type: row.ActorType, ID: row.ActorID}, CreatedAt: row.CreatedAt.Time, RedactedAt: fromTS(row.RedactedAt)}
	if row.Path.Valid {
		v.Path = &row.Path.String
	}
	if row.Content.Valid {
		v.Content = &row.Content.String
	}
	if row.ContentSha256.Valid {
		v.SHA256 = &row.ContentSha256.String
	}
	if row.SizeBytes.Valid {
		v.SizeBytes = &row.SizeBytes.Int64
	}
	if row.RedactorType.Valid {
		v.RedactedBy = &Actor{Type: row.RedactorType.String, ID: row.RedactorID.String}
	}
	return v
}

// MemoryRef is a memory as a mount shows it: its path, the version that
// holds its content, and the content's sha256 (hex) and size.
type MemoryRef struct {
	Path      string
	VersionID string
	SHA256    string
	Size      int64
}

// MemoryRefs returns store storeID's memories without their content, in
// path order (at most MaxMemoriesPerStore).
func (r MemoryStores) MemoryRefs(ctx context.Context, storeID string) ([]MemoryRef, error) {
	var out []MemoryRef
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.MemoryRefs(ctx, db.MemoryRefsParams{TenantID: tid, StoreID: storeID, Lim: MaxMemoriesPerStore})
		if err != nil {
			return translate(err, "memories")
		}
		for _, row := range rows {
			out = append(out, MemoryRef{Path: row.Path, VersionID: row.MemoryVersionID, SHA256: row.ContentSha256, Size: row.SizeBytes})
		}
		return nil
	})
	return out, err
}

// CheckMemoryPath checks a memory path as the API has it: it starts with
// "/", has 1 to 20 non-empty segments, none "." or "..", no control or
// format characters or line and paragraph separators, is in NFC and at
// most 1,024 bytes. what names it in the error.
func CheckMemoryPath(p, what string) error {
	switch {
	case !utf8.ValidString(p):
		return errdefs.InvalidArgument("%s is not valid UTF-8", what)
	case len(p) > MaxMemoryPath:
		return errdefs.InvalidArgument("%s is %d bytes; at most %d are allowed", what, len(p), MaxMemoryPath)
	case !strings.HasPrefix(p, "/"):
		return errdefs.InvalidArgument("%s %q must start with /", what, textcut.Prefix(p, 80))
	case !norm.NFC.IsNormalString(p):
		return errdefs.InvalidArgument("%s %q is not in Unicode Normalization Form C", what, textcut.Prefix(p, 80))
	}
	for _, c := range p {
		if unicode.IsControl(c) || unicode.Is(unicode.Cf, c) || c == '\u2028' || c == '\u2029' {
			return errdefs.InvalidArgument("%s %q holds a control or format character", what, textcut.Prefix(p, 80))
		}
	}
	segs := strings.Split(p[1:], "/")
	if len(segs) > MaxMemorySegments {
		return errdefs.InvalidArgument("%s has %d segments; at most %d are allowed", what, len(segs), MaxMemorySegments)
	}
	for _, s := range segs {
		if s == "" || s == "." || s == ".." {
			return errdefs.InvalidArgument("%s %q has an empty, . or .. segment", what, textcut.Prefix(p, 80))
		}
	}
	return nil
}
