package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// AuditRecord is one line of the audit log: who did what to which resource,
// when, from where, and how it ended. It never holds a secret.
type AuditRecord struct {
	ID         int64
	TenantID   tenant.ID // empty for fleet actions and unauthenticated requests
	At         time.Time
	Principal  string
	Action     string
	Resource   string
	Outcome    string
	RemoteAddr string
	RequestID  string
}

// Audit writes and reads the audit log.
type Audit struct{ s *Store }

// Audit returns the audit log repository.
func (s *Store) Audit() Audit { return Audit{s} }

// Append writes rec: in its tenant's scope when it names one, else as a
// fleet row (through the audit_fleet function).
func (r Audit) Append(ctx context.Context, rec AuditRecord) error {
	if rec.TenantID == "" || rec.TenantID.Validate() != nil {
		_, err := r.s.pool.Exec(ctx, `SELECT audit_fleet($1, $2, $3, $4, $5, $6)`,
			rec.Principal, rec.Action, rec.Resource, rec.Outcome, rec.RemoteAddr, rec.RequestID)
		if err != nil {
			return errdefs.Wrap(errdefs.UnavailableKind, err, "writing audit record")
		}
		return nil
	}
	return r.s.inTenant(tenant.With(ctx, rec.TenantID), func(q *db.Queries, tid string) error {
		err := q.AppendAudit(ctx, db.AppendAuditParams{
			TenantID:   pgtype.Text{String: tid, Valid: true},
			Principal:  rec.Principal,
			Action:     rec.Action,
			Resource:   rec.Resource,
			Outcome:    rec.Outcome,
			RemoteAddr: rec.RemoteAddr,
			RequestID:  rec.RequestID,
		})
		return translate(err, "audit record")
	})
}

// List returns up to limit records of the tenant in ctx, newest first, with
// ids below beforeID (0: from the newest).
func (r Audit) List(ctx context.Context, beforeID int64, limit int32) ([]AuditRecord, error) {
	var out []AuditRecord
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListAudit(ctx, db.ListAuditParams{TenantID: tid, BeforeID: beforeID, Lim: limit})
		if err != nil {
			return translate(err, "audit log")
		}
		for _, row := range rows {
			out = append(out, auditFromRow(row))
		}
		return nil
	})
	return out, err
}

// ListAll returns up to limit records of every tenant and the fleet (of
// tenant only, when set), newest first, through the list_audit function.
// Only fleet principals may call it.
func (r Audit) ListAll(ctx context.Context, only tenant.ID, beforeID int64, limit int32) ([]AuditRecord, error) {
	t := optText(string(only))
	rows, err := r.s.pool.Query(ctx, `SELECT id, tenant_id, at, principal, action, resource, outcome, remote_addr, request_id FROM list_audit($1, $2, $3)`, t, beforeID, limit)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "reading audit log")
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var row db.AuditLog
		if err := rows.Scan(&row.ID, &row.TenantID, &row.At, &row.Principal, &row.Action, &row.Resource, &row.Outcome, &row.RemoteAddr, &row.RequestID); err != nil {
			return nil, err
		}
		out = append(out, auditFromRow(row))
	}
	return out, rows.Err()
}

func auditFromRow(row db.AuditLog) AuditRecord {
	return AuditRecord{
		ID: row.ID, TenantID: tenant.ID(row.TenantID.String), At: row.At.Time,
		Principal: row.Principal, Action: row.Action, Resource: row.Resource,
		Outcome: row.Outcome, RemoteAddr: row.RemoteAddr, RequestID: row.RequestID,
	}
}
