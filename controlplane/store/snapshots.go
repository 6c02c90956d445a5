package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
)

// WorkspaceSnapshot is one snapshot of a session's workspace in the blob
// store: a full copy, or an increment over the snapshot before it.
type WorkspaceSnapshot struct {
	SessionID string
	Seq       int64
	BlobKey   string
	Full      bool
	// Origin says what took it: "turn", "running", "evicted", "restored".
	Origin string
	// HostID and SandboxID are the sandbox it was taken of.
	HostID, SandboxID string
	// TakenAt is the host's clock when it began listing the workspace.
	TakenAt      time.Time
	Files, Bytes int64
	CreatedAt    time.Time
}

// Snapshots is the repository of workspace snapshots.
type Snapshots struct{ s *Store }

// Snapshots returns the workspace snapshot repository.
func (s *Store) Snapshots() Snapshots { return Snapshots{s} }

// Add records a snapshot (in the tenant in ctx).
func (r Snapshots) Add(ctx context.Context, w WorkspaceSnapshot) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		err := q.AddWorkspaceSnapshot(ctx, db.AddWorkspaceSnapshotParams{TenantID: tid, SessionID: w.SessionID, Seq: w.Seq,
			BlobKey: w.BlobKey, FullCopy: w.Full, Origin: w.Origin, HostID: w.HostID, SandboxID: w.SandboxID,
			TakenAt: pgtype.Timestamptz{Time: w.TakenAt, Valid: true}, Files: w.Files, Bytes: w.Bytes})
		return translate(err, "workspace snapshot of session "+w.SessionID)
	})
}

// List returns the session's snapshots, oldest first.
func (r Snapshots) List(ctx context.Context, sessionID string) ([]WorkspaceSnapshot, error) {
	var out []WorkspaceSnapshot
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListWorkspaceSnapshots(ctx, db.ListWorkspaceSnapshotsParams{TenantID: tid, SessionID: sessionID})
		for _, row := range rows {
			out = append(out, WorkspaceSnapshot{SessionID: row.SessionID, Seq: row.Seq, BlobKey: row.BlobKey, Full: row.FullCopy, Origin: row.Origin,
				HostID: row.HostID, SandboxID: row.SandboxID, TakenAt: row.TakenAt.Time, Files: row.Files, Bytes: row.Bytes,
				CreatedAt: row.CreatedAt.Time})
		}
		return translate(err, "workspace snapshots of session "+sessionID)
	})
	return out, err
}

// DropBefore forgets the session's snapshots older than seq.
func (r Snapshots) DropBefore(ctx context.Context, sessionID string, seq int64) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		err := q.DeleteWorkspaceSnapshotsBefore(ctx, db.DeleteWorkspaceSnapshotsBeforeParams{TenantID: tid, SessionID: sessionID, Seq: seq})
		return translate(err, "workspace snapshots of session "+sessionID)
	})
}
