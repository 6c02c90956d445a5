package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// Principal kinds.
const (
	// PrincipalUser is an identity from an OpenID Provider.
	PrincipalUser = "user"
	// PrincipalService holds API keys; its keys act as it.
	PrincipalService = "service"
)

// Principal is a user or service principal of a tenant.
type Principal struct {
	TenantID tenant.ID
	ID       string
	Kind     string
	Name     string
	// Issuer and Subject identify a user at its OpenID Provider; empty for
	// services.
	Issuer, Subject string
	// Roles are granted to the principal (policy/roles.yaml). A user also
	// holds the roles its token's groups map to.
	Roles      []string
	CreatedAt  time.Time
	DisabledAt *time.Time
	LastSeenAt *time.Time
}

// Disabled reports whether the principal is refused.
func (p Principal) Disabled() bool { return p.DisabledAt != nil }

// NewPrincipal describes a principal to add.
type NewPrincipal struct {
	Kind string // PrincipalUser or PrincipalService
	Name string
	// Issuer and Subject are required for users and refused for services.
	Issuer, Subject string
	Roles           []string
}

// Principals administers a tenant's users and service principals. The
// caller checks that roles exist in the policy.
type Principals struct{ s *Store }

// Principals returns the principal repository.
func (s *Store) Principals() Principals { return Principals{s} }

// maxPrincipalName bounds names, issuers and subjects.
const maxPrincipalName = 255

func (np *NewPrincipal) validate() error {
	np.Name = strings.TrimSpace(np.Name)
	switch {
	case np.Kind != PrincipalUser && np.Kind != PrincipalService:
		return errdefs.InvalidArgument("principal kind must be %q or %q, not %q", PrincipalUser, PrincipalService, np.Kind)
	case np.Name == "" && np.Kind == PrincipalService:
		return errdefs.InvalidArgument("a service principal needs a name")
	case len(np.Name) > maxPrincipalName || len(np.Issuer) > maxPrincipalName || len(np.Subject) > maxPrincipalName:
		return errdefs.InvalidArgument("principal name, issuer and subject are at most %d bytes", maxPrincipalName)
	case strings.ContainsFunc(np.Name+np.Issuer+np.Subject, unicode.IsControl):
		// Names end up in the audit log and in error messages.
		return errdefs.InvalidArgument("principal name, issuer and subject must not hold control characters")
	case np.Kind == PrincipalUser && (np.Issuer == "" || np.Subject == ""):
		return errdefs.InvalidArgument("a user needs the issuer and subject of its tokens")
	case np.Kind == PrincipalService && (np.Issuer != "" || np.Subject != ""):
		return errdefs.InvalidArgument("a service principal has no issuer or subject; it authenticates with API keys")
	}
	if np.Name == "" {
		np.Name = np.Subject
	}
	if np.Roles == nil {
		np.Roles = []string{}
	}
	return nil
}

// Create adds a principal to the tenant in ctx.
func (r Principals) Create(ctx context.Context, np NewPrincipal) (Principal, error) {
	var p Principal
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) (err error) {
		p, err = createPrincipal(ctx, q, tid, np)
		return err
	})
	return p, err
}

// createPrincipal adds np to tenant tid.
func createPrincipal(ctx context.Context, q *db.Queries, tid string, np NewPrincipal) (Principal, error) {
	if err := np.validate(); err != nil {
		return Principal{}, err
	}
	row, err := q.CreatePrincipal(ctx, db.CreatePrincipalParams{
		TenantID: tid, ID: newPrincipalID(), Kind: np.Kind, Name: np.Name,
		Issuer: optText(np.Issuer), Subject: optText(np.Subject), Roles: np.Roles,
	})
	if err != nil {
		return Principal{}, translate(err, "principal "+np.Name)
	}
	return principalFromRow(row), nil
}

// List returns the tenant's principals, oldest first.
func (r Principals) List(ctx context.Context) ([]Principal, error) {
	var out []Principal
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListPrincipals(ctx, tid)
		if err != nil {
			return translate(err, "principals")
		}
		for _, row := range rows {
			out = append(out, principalFromRow(row))
		}
		return nil
	})
	return out, err
}

// Get returns the tenant's principal id.
func (r Principals) Get(ctx context.Context, id string) (Principal, error) {
	return r.one(ctx, id, func(q *db.Queries, tid string) (db.Principal, error) {
		return q.GetPrincipal(ctx, db.GetPrincipalParams{TenantID: tid, ID: id})
	})
}

// SetRoles replaces the roles granted to principal id.
func (r Principals) SetRoles(ctx context.Context, id string, roles []string) (Principal, error) {
	if roles == nil {
		roles = []string{}
	}
	return r.one(ctx, id, func(q *db.Queries, tid string) (db.Principal, error) {
		return q.SetPrincipalRoles(ctx, db.SetPrincipalRolesParams{TenantID: tid, ID: id, Roles: roles})
	})
}

// SetDisabled disables principal id (its keys and tokens are refused) or
// enables it again. Disabling twice keeps the first time.
func (r Principals) SetDisabled(ctx context.Context, id string, disabled bool) (Principal, error) {
	return r.one(ctx, id, func(q *db.Queries, tid string) (db.Principal, error) {
		return q.SetPrincipalDisabled(ctx, db.SetPrincipalDisabledParams{TenantID: tid, ID: id, Disabled: disabled})
	})
}

func (r Principals) one(ctx context.Context, id string, fn func(q *db.Queries, tid string) (db.Principal, error)) (Principal, error) {
	var p Principal
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := fn(q, tid)
		if err != nil {
			return translate(err, "principal "+id)
		}
		p = principalFromRow(row)
		return nil
	})
	return p, err
}

// SeenUser returns the tenant's user with this issuer and subject, adding
// it (named name, or the subject when name is empty) on first sight, and
// records that it was seen (at most once a minute).
func (r Principals) SeenUser(ctx context.Context, issuer, subject, name string) (Principal, error) {
	np := NewPrincipal{Kind: PrincipalUser, Name: name, Issuer: issuer, Subject: subject}
	if err := np.validate(); err != nil {
		return Principal{}, err
	}
	var p Principal
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.UpsertUser(ctx, db.UpsertUserParams{
			TenantID: tid, ID: newPrincipalID(), Name: np.Name,
			Issuer: optText(issuer), Subject: optText(subject),
		})
		if errors.Is(err, pgx.ErrNoRows) { // known, and seen within the minute
			row, err = q.GetUser(ctx, db.GetUserParams{TenantID: tid, Issuer: optText(issuer), Subject: optText(subject)})
		}
		if err != nil {
			return translate(err, "user "+subject)
		}
		p = principalFromRow(row)
		return nil
	})
	return p, err
}

func newPrincipalID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	return "prn_" + base64.RawURLEncoding.EncodeToString(b)
}

// optText is s, or NULL when s is empty.
func optText(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func principalFromRow(row db.Principal) Principal {
	return Principal{
		TenantID: tenant.ID(row.TenantID), ID: row.ID, Kind: row.Kind, Name: row.Name,
		Issuer: row.Issuer.String, Subject: row.Subject.String, Roles: row.Roles,
		CreatedAt: row.CreatedAt.Time, DisabledAt: fromTS(row.DisabledAt), LastSeenAt: fromTS(row.LastSeenAt),
	}
}
