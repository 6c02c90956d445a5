package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/textcut"
)

// EgressRecord is one connection of the egress audit trail: a sandbox's
// attempt to reach Host:Port through its host's proxy, and the verdict.
type EgressRecord struct {
	ID        int64
	TenantID  tenant.ID
	SessionID string
	// HostID is the host whose proxy saw it.
	HostID string
	// Host and Port are what the sandbox asked for; Address what the
	// proxy dialled ("" when none).
	Host    string
	Port    int32
	Address string
	Allowed bool
	// Reason says why it was denied, or why an allowed one was cut.
	Reason string
	// CredentialInjected: the proxy put a credential's secret into a
	// request of this connection (never which, nor the secret).
	CredentialInjected bool
	BytesUp, BytesDown int64
	Start, End         time.Time
	RecordedAt         time.Time
	// RecordID is the host's id for the record ("" from a host that sends
	// none): a record is stored once per host and RecordID.
	RecordID string
}

// Bounds on the fields of a record, cut before they are stored (the host
// cuts them too; the sandbox chose the host name).
const (
	maxEgressHost    = 253
	maxEgressReason  = 256
	maxEgressAddress = 64
	maxEgressID      = 128
	// maxEgressRecordID bounds a record id (the host sends at most 64
	// bytes); a longer one is cut, so distinct ids that share the first
	// bytes would count as one: the host's loss, not another's.
	maxEgressRecordID = 64
)

// Egress is the egress audit trail.
type Egress struct{ s *Store }

// Egress returns the egress audit trail's repository.
func (s *Store) Egress() Egress { return Egress{s} }

// Append stores records, each in its own tenant's scope (one transaction
// per tenant). A record naming no valid tenant is skipped and counted; one
// whose RecordID the host's records already have is not stored again.
func (r Egress) Append(ctx context.Context, hostID string, recs []EgressRecord) (skipped int, err error) {
	byTenant := map[tenant.ID][]EgressRecord{}
	for _, rec := range recs {
		if rec.TenantID.Validate() != nil {
			skipped++
			continue
		}
		byTenant[rec.TenantID] = append(byTenant[rec.TenantID], rec)
	}
	for tid, rs := range byTenant {
		err := r.s.inTenant(tenant.With(ctx, tid), func(q *db.Queries, tid string) error {
			for _, rec := range rs {
				if err := q.AppendEgress(ctx, db.AppendEgressParams{
					TenantID:           tid,
					SessionID:          textcut.Prefix(rec.SessionID, maxEgressID),
					HostID:             textcut.Prefix(hostID, maxEgressID),
					DestHost:           textcut.Prefix(rec.Host, maxEgressHost),
					DestPort:           max(0, min(rec.Port, 65535)),
					Address:            textcut.Prefix(rec.Address, maxEgressAddress),
					Allowed:            rec.Allowed,
					Reason:             textcut.Prefix(rec.Reason, maxEgressReason),
					BytesUp:            max(0, rec.BytesUp),
					BytesDown:          max(0, rec.BytesDown),
					StartedAt:          pgtype.Timestamptz{Time: rec.Start, Valid: true},
					EndedAt:            pgtype.Timestamptz{Time: rec.End, Valid: true},
					CredentialInjected: rec.CredentialInjected,
					RecordID:           textcut.Prefix(rec.RecordID, maxEgressRecordID),
				}); err != nil {
					return translate(err, "egress record")
				}
			}
			return nil
		})
		if err != nil {
			return skipped, err
		}
	}
	return skipped, nil
}

// List returns up to limit records of the tenant in ctx (of one session
// when sessionID is set), newest first, with ids below beforeID (0: from
// the newest).
func (r Egress) List(ctx context.Context, sessionID string, beforeID int64, limit int32) ([]EgressRecord, error) {
	var out []EgressRecord
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListEgress(ctx, db.ListEgressParams{TenantID: tid, SessionID: sessionID, BeforeID: beforeID, Lim: limit})
		if err != nil {
			return translate(err, "egress records")
		}
		for _, row := range rows {
			out = append(out, EgressRecord{
				ID: row.ID, TenantID: tenant.ID(row.TenantID), SessionID: row.SessionID, HostID: row.HostID,
				Host: row.DestHost, Port: row.DestPort, Address: row.Address, Allowed: row.Allowed, Reason: row.Reason,
				BytesUp: row.BytesUp, BytesDown: row.BytesDown, Start: row.StartedAt.Time, End: row.EndedAt.Time, CredentialInjected: row.CredentialInjected,
				RecordedAt: row.RecordedAt.Time, RecordID: row.RecordID,
			})
		}
		return nil
	})
	return out, err
}
