package store

import (
	"context"
	"slices"
	"time"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
)

// FileIDPrefix is the prefix of file ids, as the Files API has them.
const FileIDPrefix = "file_"

// NewFileID returns a fresh file id. The caller stores the file's content
// under FileBlobKey before it creates the row, so it picks the id.
func NewFileID() string { return newID(FileIDPrefix) }

// FileBlobKey is where a file's content lives in the blob store.
func FileBlobKey(tenantID, fileID string) string { return FilesBlobPrefix(tenantID) + "/" + fileID }

// FilesBlobPrefix is the blob store folder of a tenant's files.
func FilesBlobPrefix(tenantID string) string { return "files/" + tenantID }

// File is a file's metadata; its content is in the blob store under
// BlobKey.
type File struct {
	ID        string
	Filename  string
	MimeType  string
	SizeBytes int64
	// Downloadable says whether the content may be read back.
	Downloadable bool
	// ScopeID is the session whose output the file is ("" for uploads).
	ScopeID string
	BlobKey string
	// SHA256 is the hex SHA-256 of an output's content ("" for uploads):
	// publishing a session's outputs again keeps what did not change.
	SHA256    string
	CreatedAt time.Time
}

// FileListOptions filter and page Files.List. At most one of After and
// Before is set.
type FileListOptions struct {
	Limit int
	// ScopeID, when set, keeps the files of that session only.
	ScopeID string
	// IDs, when set, keeps those files only.
	IDs []string
	// After continues the listing (newest first) past this key; Before
	// returns the page just before it, still newest first.
	After, Before *Key
}

// Files is the repository of files' metadata.
type Files struct{ s *Store }

// Files returns the file repository.
func (s *Store) Files() Files { return Files{s} }

// Used returns the bytes the tenant in ctx has stored in files.
func (r Files) Used(ctx context.Context) (int64, error) {
	var n int64
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		n, err = q.FileBytes(ctx, tid)
		return translate(err, "file storage")
	})
	return n, err
}

// Create records f, whose content the caller has stored under f.BlobKey.
// With quota above zero, it refuses (resource exhausted) a file that would
// take the tenant's stored bytes past quota; a per-tenant lock held to the
// end of the transaction makes concurrent creates take turns, so the sum
// cannot race.
func (r Files) Create(ctx context.Context, f File, quota int64) (File, error) {
	var out File
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if quota > 0 {
			if err := q.LockTenantFiles(ctx, tid); err != nil {
				return translate(err, "file storage")
			}
			used, err := q.FileBytes(ctx, tid)
			if err != nil {
				return translate(err, "file storage")
			}
			if used+f.SizeBytes > quota {
				return QuotaError(tid, used, f.SizeBytes, quota)
			}
		}
		row, err := q.CreateFile(ctx, db.CreateFileParams{TenantID: tid, ID: f.ID, Filename: f.Filename, MimeType: f.MimeType,
			SizeBytes: f.SizeBytes, Downloadable: f.Downloadable, ScopeID: optText(f.ScopeID), BlobKey: f.BlobKey, Sha256: optText(f.SHA256)})
		if err != nil {
			return translate(err, "file")
		}
		out = fileFromRow(row)
		return nil
	})
	return out, err
}

// MaxScopeFiles bounds the outputs Scope returns.
const MaxScopeFiles = 10_000

// Scope returns the files of session scopeID (its outputs), oldest first,
// at most MaxScopeFiles.
func (r Files) Scope(ctx context.Context, scopeID string) ([]File, error) {
	var out []File
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ScopeFiles(ctx, db.ScopeFilesParams{TenantID: tid, ScopeID: optText(scopeID), Lim: MaxScopeFiles})
		if err != nil {
			return translate(err, "files")
		}
		for _, row := range rows {
			out = append(out, fileFromRow(row))
		}
		return nil
	})
	return out, err
}

// Replace records f, as Create does, and in the same transaction removes
// the row of file replaces (when not ""), whose bytes no longer count
// against quota. It returns the removed row (nil if it was gone already);
// the caller deletes its blob after.
func (r Files) Replace(ctx context.Context, f File, replaces string, quota int64) (File, *File, error) {
	var out File
	var old *File
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var oldSize int64
		if replaces != "" {
			row, err := q.DeleteFile(ctx, db.DeleteFileParams{TenantID: tid, ID: replaces})
			switch {
			case err == nil:
				o := fileFromRow(row)
				old, oldSize = &o, o.SizeBytes
			case !errdefs.IsNotFound(translate(err, "file")):
				return translate(err, "file "+replaces)
			}
		}
		if quota > 0 {
			if err := q.LockTenantFiles(ctx, tid); err != nil {
				return translate(err, "file storage")
			}
			used, err := q.FileBytes(ctx, tid)
			if err != nil {
				return translate(err, "file storage")
			}
			if used+f.SizeBytes > quota {
				return QuotaError(tid, used+oldSize, f.SizeBytes, quota)
			}
		}
		row, err := q.CreateFile(ctx, db.CreateFileParams{TenantID: tid, ID: f.ID, Filename: f.Filename, MimeType: f.MimeType,
			SizeBytes: f.SizeBytes, Downloadable: f.Downloadable, ScopeID: optText(f.ScopeID), BlobKey: f.BlobKey, Sha256: optText(f.SHA256)})
		if err != nil {
			return translate(err, "file")
		}
		out = fileFromRow(row)
		return nil
	})
	if err != nil {
		return File{}, nil, err
	}
	return out, old, nil
}

// QuotaError is the refusal of a file that would take tenant tid's stored
// bytes (used) past its quota.
func QuotaError(tid string, used, more, quota int64) error {
	return errdefs.ResourceExhausted("tenant %s: quota file_storage_mib exceeded (%d bytes stored, %d more, limit %d bytes); delete files first", tid, used, more, quota)
}

// Get returns file id.
func (r Files) Get(ctx context.Context, id string) (File, error) {
	var out File
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetFile(ctx, db.GetFileParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "file "+id)
		}
		out = fileFromRow(row)
		return nil
	})
	return out, err
}

// Delete removes file id's row and returns it; the caller deletes the
// blob after, so readers never see a file without content.
func (r Files) Delete(ctx context.Context, id string) (File, error) {
	var out File
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.DeleteFile(ctx, db.DeleteFileParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "file "+id)
		}
		out = fileFromRow(row)
		return nil
	})
	return out, err
}

// MaxReferencedKeys bounds one Referenced call.
const MaxReferencedKeys = 1000

// Referenced returns which of keys (blob keys, at most MaxReferencedKeys)
// a file of the tenant in ctx holds.
func (r Files) Referenced(ctx context.Context, keys []string) (map[string]bool, error) {
	if len(keys) > MaxReferencedKeys {
		return nil, errdefs.InvalidArgument("at most %d blob keys at once (got %d)", MaxReferencedKeys, len(keys))
	}
	out := make(map[string]bool, len(keys))
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		held, err := q.FileBlobKeysIn(ctx, db.FileBlobKeysInParams{TenantID: tid, Keys: keys})
		if err != nil {
			return translate(err, "files")
		}
		for _, k := range held {
			out[k] = true
		}
		return nil
	})
	return out, err
}

// List returns a page of files, newest first, and whether more follow
// (past the page's end; with Before, newer ones before its start).
func (r Files) List(ctx context.Context, opts FileListOptions) ([]File, bool, error) {
	n, lim := pageLimit(opts.Limit)
	key, before := opts.After, false
	if opts.Before != nil {
		key, before = opts.Before, true
	}
	kc, kid := keyTS(key)
	var out []File
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListFiles(ctx, db.ListFilesParams{TenantID: tid, ScopeID: optText(opts.ScopeID), Ids: orEmpty(opts.IDs),
			KeyCreated: kc, KeyID: kid, Before: before, Lim: lim})
		if err != nil {
			return translate(err, "files")
		}
		for _, row := range rows {
			out = append(out, fileFromRow(row))
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
	if before {
		slices.Reverse(out)
	}
	return out, more, nil
}

func fileFromRow(row db.File) File {
	return File{ID: row.ID, Filename: row.Filename, MimeType: row.MimeType, SizeBytes: row.SizeBytes, Downloadable: row.Downloadable,
		ScopeID: row.ScopeID.String, BlobKey: row.BlobKey, SHA256: row.Sha256.String, CreatedAt: row.CreatedAt.Time}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
