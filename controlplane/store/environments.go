package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
)

// Environment is a sandbox configuration that sessions run in.
type Environment struct {
	ID          string
	Name        string
	Description *string
	// Config is the API's resolved config object; the store does not look
	// inside.
	Config     json.RawMessage
	Scope      string
	Metadata   map[string]string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ArchivedAt *time.Time
}

// EnvironmentListOptions filter and page Environments.List.
type EnvironmentListOptions struct {
	IncludeArchived bool
	Limit           int
	// After continues a listing after this key (newest first).
	After *Key
}

// Environments stores a tenant's environments. Names are unique per tenant.
type Environments struct{ s *Store }

// Environments returns the environment repository.
func (s *Store) Environments() Environments { return Environments{s} }

// Create stores e under a new id. A name already in use is AlreadyExists.
func (r Environments) Create(ctx context.Context, e Environment) (Environment, error) {
	var out Environment
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.CreateEnvironment(ctx, db.CreateEnvironmentParams{
			TenantID:    tid,
			ID:          newID(EnvironmentIDPrefix),
			Name:        e.Name,
			Description: text(e.Description),
			Config:      orEmptyJSON(e.Config, "{}"),
			Scope:       e.Scope,
			Metadata:    marshalMetadata(e.Metadata),
		})
		if err != nil {
			return envNameTaken(translate(err, "environment"), e.Name)
		}
		out, err = environmentFromRow(row)
		return err
	})
	return out, err
}

// Get returns environment id.
func (r Environments) Get(ctx context.Context, id string) (Environment, error) {
	var out Environment
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetEnvironment(ctx, db.GetEnvironmentParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "environment "+id)
		}
		out, err = environmentFromRow(row)
		return err
	})
	return out, err
}

// Update replaces environment id's fields with what apply returns; apply
// runs under the row lock. Archived environments cannot be updated.
func (r Environments) Update(ctx context.Context, id string, apply func(cur Environment) (Environment, error)) (Environment, error) {
	var out Environment
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.LockEnvironment(ctx, db.LockEnvironmentParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "environment "+id)
		}
		cur, err := environmentFromRow(row)
		if err != nil {
			return err
		}
		if cur.ArchivedAt != nil {
			return errdefs.FailedPrecondition("environment %s is archived and cannot be updated", id)
		}
		next, err := apply(cur)
		if err != nil {
			return err
		}
		row, err = q.UpdateEnvironment(ctx, db.UpdateEnvironmentParams{
			TenantID:    tid,
			ID:          id,
			Name:        next.Name,
			Description: text(next.Description),
			Config:      orEmptyJSON(next.Config, "{}"),
			Scope:       next.Scope,
			Metadata:    marshalMetadata(next.Metadata),
		})
		if err != nil {
			return envNameTaken(translate(err, "environment"), next.Name)
		}
		out, err = environmentFromRow(row)
		return err
	})
	return out, err
}

// Archive marks environment id archived; archiving twice is a no-op.
func (r Environments) Archive(ctx context.Context, id string) (Environment, error) {
	var out Environment
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.ArchiveEnvironment(ctx, db.ArchiveEnvironmentParams{TenantID: tid, ID: id})
		if err != nil {
			return translate(err, "environment "+id)
		}
		out, err = environmentFromRow(row)
		return err
	})
	return out, err
}

// Delete removes environment id. One that sessions still use is a failed
// precondition.
func (r Environments) Delete(ctx context.Context, id string) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		n, err := q.DeleteEnvironment(ctx, db.DeleteEnvironmentParams{TenantID: tid, ID: id})
		if err != nil {
			if errdefs.IsFailedPrecondition(translate(err, "")) {
				return errdefs.FailedPrecondition("environment %s is used by sessions; delete them first", id)
			}
			return translate(err, "environment "+id)
		}
		if n == 0 {
			return errdefs.NotFound("environment %s not found", id)
		}
		return nil
	})
}

// List returns the tenant's environments, newest first, and whether more
// follow.
func (r Environments) List(ctx context.Context, opts EnvironmentListOptions) ([]Environment, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.After)
	var out []Environment
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListEnvironments(ctx, db.ListEnvironmentsParams{
			TenantID: tid, IncludeArchived: opts.IncludeArchived, BeforeCreated: kc, BeforeID: kid, Lim: lim,
		})
		if err != nil {
			return translate(err, "environments")
		}
		for _, row := range rows {
			e, err := environmentFromRow(row)
			if err != nil {
				return err
			}
			out = append(out, e)
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

func envNameTaken(err error, name string) error {
	if errdefs.IsAlreadyExists(err) {
		return errdefs.AlreadyExists("an environment named %q already exists", name)
	}
	return err
}

func text(s *string) pgtype.Text {
	if s == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: *s, Valid: true}
}

func fromText(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	s := t.String
	return &s
}

func environmentFromRow(row db.Environment) (Environment, error) {
	md, err := unmarshalMetadata(row.Metadata)
	if err != nil {
		return Environment{}, err
	}
	return Environment{
		ID:          row.ID,
		Name:        row.Name,
		Description: fromText(row.Description),
		Config:      json.RawMessage(row.Config),
		Scope:       row.Scope,
		Metadata:    md,
		CreatedAt:   row.CreatedAt.Time,
		UpdatedAt:   row.UpdatedAt.Time,
		ArchivedAt:  fromTS(row.ArchivedAt),
	}, nil
}
