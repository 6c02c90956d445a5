package store

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
)

// Id prefixes of skills and their versions.
const (
	SkillIDPrefix        = "skill_"
	SkillVersionIDPrefix = "skillver_"
)

// NewSkillID and NewSkillVersionID return fresh ids. The caller stores a
// version's bundle under SkillBlobKey before it creates the row, so it
// picks the ids.
func NewSkillID() string        { return newID(SkillIDPrefix) }
func NewSkillVersionID() string { return newID(SkillVersionIDPrefix) }

// SkillsBlobPrefix is the blob store folder of a tenant's skill bundles.
func SkillsBlobPrefix(tenantID string) string { return "skills/" + tenantID }

// SkillVersionBlobPrefix is the blob store folder of one skill version:
// its bundle as a zip archive (SkillBlobKey) and each of its files
// (SkillFileBlobKey).
func SkillVersionBlobPrefix(tenantID, skillID, versionID string) string {
	return SkillsBlobPrefix(tenantID) + "/" + skillID + "/" + versionID
}

// SkillBlobKey is where a skill version's bundle (a zip archive) lives.
func SkillBlobKey(tenantID, skillID, versionID string) string {
	return SkillVersionBlobPrefix(tenantID, skillID, versionID) + "/bundle.zip"
}

// SkillFileBlobKey is where file n (of SkillVersion.Files) of a skill
// version lives.
func SkillFileBlobKey(tenantID, skillID, versionID string, n int) string {
	return SkillVersionBlobPrefix(tenantID, skillID, versionID) + "/files/" + strconv.Itoa(n)
}

// SkillFile is one file of a skill version: its path beneath the
// skill's directory, and its size.
type SkillFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// Skill is a custom skill: its slug (Name, from its first version's
// SKILL.md, never changed) and its newest version.
type Skill struct {
	ID              string
	Name            string
	DisplayName     string
	LatestVersionID string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// SkillVersion is one uploaded bundle of a skill; its files are in the
// blob store under BlobKey, as a zip archive.
type SkillVersion struct {
	ID          string
	SkillID     string
	Name        string
	Description string
	SizeBytes   int64
	FileCount   int
	BlobKey     string
	Files       []SkillFile
	CreatedAt   time.Time
}

// MaxSkillVersions bounds the versions one skill keeps (and so the blobs a
// skill's delete removes).
const MaxSkillVersions = 1000

// Skills is the repository of skills and their versions.
type Skills struct{ s *Store }

// Skills returns the skill repository.
func (s *Store) Skills() Skills { return Skills{s} }

// Create records skill sk with its first version v, whose bundle the
// caller has stored under v.BlobKey.
func (r Skills) Create(ctx context.Context, sk Skill, v SkillVersion) (Skill, SkillVersion, error) {
	var outS Skill
	var outV SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.CreateSkill(ctx, db.CreateSkillParams{TenantID: tid, ID: sk.ID, Name: sk.Name, DisplayName: sk.DisplayName, LatestVersionID: v.ID})
		if err != nil {
			return translate(err, "skill")
		}
		vrow, err := q.CreateSkillVersion(ctx, versionParams(tid, sk.ID, v))
		if err != nil {
			return translate(err, "skill version")
		}
		outS, outV = skillFromRow(row), skillVersionFromRow(vrow)
		return nil
	})
	return outS, outV, err
}

// AddVersion records v as skill skillID's newest version. Its name must be
// the skill's (failed precondition otherwise: a skill's slug never
// changes).
func (r Skills) AddVersion(ctx context.Context, skillID string, v SkillVersion) (SkillVersion, error) {
	var out SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		sk, err := q.LockSkill(ctx, db.LockSkillParams{TenantID: tid, ID: skillID})
		if err != nil {
			return translate(err, "skill "+skillID)
		}
		if sk.Name != v.Name {
			return errdefs.InvalidArgument("SKILL.md: name %q is not the skill's name %q (a skill's name never changes)", v.Name, sk.Name)
		}
		n, err := q.CountSkillVersions(ctx, db.CountSkillVersionsParams{TenantID: tid, SkillID: skillID})
		if err != nil {
			return translate(err, "skill versions")
		}
		if n >= MaxSkillVersions {
			return errdefs.ResourceExhausted("skill %s has %d versions, the most it keeps; delete some first", skillID, n)
		}
		row, err := q.CreateSkillVersion(ctx, versionParams(tid, skillID, v))
		if err != nil {
			return translate(err, "skill version")
		}
		if err := q.SetSkillLatest(ctx, db.SetSkillLatestParams{TenantID: tid, ID: skillID, LatestVersionID: row.ID}); err != nil {
			return translate(err, "skill "+skillID)
		}
		out = skillVersionFromRow(row)
		return nil
	})
	return out, err
}

// Get returns skill id.
func (r Skills) Get(ctx context.Context, id string) (Skill, error) {
	var out Skill
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetSkill(ctx, db.GetSkillParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "skill "+id)
		}
		out = skillFromRow(row)
		return nil
	})
	return out, err
}

// Delete removes skill id with every version and returns the versions, so
// that the caller deletes their blobs after.
func (r Skills) Delete(ctx context.Context, id string) ([]SkillVersion, error) {
	var out []SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.AllSkillVersions(ctx, db.AllSkillVersionsParams{TenantID: tid, SkillID: id, Lim: MaxSkillVersions})
		if err != nil {
			return translate(err, "skill versions")
		}
		if _, err := q.DeleteSkill(ctx, db.DeleteSkillParams{TenantID: tid, ID: id}); err != nil {
			return translate(err, "skill "+id)
		}
		for _, row := range rows {
			out = append(out, skillVersionFromRow(row))
		}
		return nil
	})
	return out, err
}

// List returns a page of skills, newest first, and whether more follow.
func (r Skills) List(ctx context.Context, limit int, after *Key) ([]Skill, bool, error) {
	n, lim := pageLimit(limit)
	kc, kid := keyTS(after)
	var out []Skill
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListSkills(ctx, db.ListSkillsParams{TenantID: tid, KeyCreated: kc, KeyID: kid, Lim: lim})
		if err != nil {
			return translate(err, "skills")
		}
		for _, row := range rows {
			out = append(out, skillFromRow(row))
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

// Version returns version id of skill skillID; id "latest" is the skill's
// newest.
func (r Skills) Version(ctx context.Context, skillID, id string) (SkillVersion, error) {
	var out SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if id == "latest" {
			sk, err := q.GetSkill(ctx, db.GetSkillParams{TenantID: tid, ID: skillID})
			if err != nil {
				return translate(err, "skill "+skillID)
			}
			id = sk.LatestVersionID
		}
		row, err := q.GetSkillVersion(ctx, db.GetSkillVersionParams{TenantID: tid, SkillID: skillID, ID: id})
		if err != nil {
			return translate(err, "version "+id+" of skill "+skillID)
		}
		out = skillVersionFromRow(row)
		return nil
	})
	return out, err
}

// DeleteVersion removes version id of skill skillID and returns it (the
// caller deletes its blob after). The skill's latest version becomes the
// newest left; its last version is refused (failed precondition): delete
// the skill instead.
func (r Skills) DeleteVersion(ctx context.Context, skillID, id string) (SkillVersion, error) {
	var out SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.LockSkill(ctx, db.LockSkillParams{TenantID: tid, ID: skillID}); err != nil {
			return translate(err, "skill "+skillID)
		}
		row, err := q.DeleteSkillVersion(ctx, db.DeleteSkillVersionParams{TenantID: tid, SkillID: skillID, ID: id})
		if err != nil {
			return translate(err, "version "+id+" of skill "+skillID)
		}
		newest, err := q.NewestSkillVersion(ctx, db.NewestSkillVersionParams{TenantID: tid, SkillID: skillID})
		if errdefs.IsNotFound(translate(err, "")) {
			return errdefs.FailedPrecondition("version %s is the last of skill %s: delete the skill instead", id, skillID)
		}
		if err != nil {
			return translate(err, "skill versions")
		}
		if err := q.SetSkillLatest(ctx, db.SetSkillLatestParams{TenantID: tid, ID: skillID, LatestVersionID: newest.ID}); err != nil {
			return translate(err, "skill "+skillID)
		}
		out = skillVersionFromRow(row)
		return nil
	})
	return out, err
}

// Versions returns a page of skill skillID's versions, newest first, and
// whether more follow. An unknown skill is not found.
func (r Skills) Versions(ctx context.Context, skillID string, limit int, after *Key) ([]SkillVersion, bool, error) {
	n, lim := pageLimit(limit)
	kc, kid := keyTS(after)
	var out []SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.GetSkill(ctx, db.GetSkillParams{TenantID: tid, ID: skillID}); err != nil {
			return translate(err, "skill "+skillID)
		}
		rows, err := q.ListSkillVersions(ctx, db.ListSkillVersionsParams{TenantID: tid, SkillID: skillID, KeyCreated: kc, KeyID: kid, Lim: lim})
		if err != nil {
			return translate(err, "skill versions")
		}
		for _, row := range rows {
			out = append(out, skillVersionFromRow(row))
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

// VersionByID returns skill version id, whichever skill it is of.
func (r Skills) VersionByID(ctx context.Context, id string) (SkillVersion, error) {
	var out SkillVersion
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetSkillVersionByID(ctx, db.GetSkillVersionByIDParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "skill version "+id)
		}
		out = skillVersionFromRow(row)
		return nil
	})
	return out, err
}

func versionParams(tid, skillID string, v SkillVersion) db.CreateSkillVersionParams {
	files, _ := json.Marshal(v.Files) // strings and integers only
	if v.Files == nil {
		files = []byte("[]")
	}
	return db.CreateSkillVersionParams{TenantID: tid, SkillID: skillID, ID: v.ID, Name: v.Name, Description: v.Description,
		SizeBytes: v.SizeBytes, FileCount: int32(v.FileCount), BlobKey: v.BlobKey, Files: files}
}

func skillFromRow(row db.Skill) Skill {
	return Skill{ID: row.ID, Name: row.Name, DisplayName: row.DisplayName, LatestVersionID: row.LatestVersionID,
		CreatedAt: row.CreatedAt.Time, UpdatedAt: row.UpdatedAt.Time}
}

func skillVersionFromRow(row db.SkillVersion) SkillVersion {
	var files []SkillFile
	_ = json.Unmarshal(row.Files, &files) // written by versionParams
	return SkillVersion{ID: row.ID, SkillID: row.SkillID, Name: row.Name, Description: row.Description, SizeBytes: row.SizeBytes,
		FileCount: int(row.FileCount), BlobKey: row.BlobKey, Files: files, CreatedAt: row.CreatedAt.Time}
}
