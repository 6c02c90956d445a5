package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/internal/errdefs"
)

// Agent is one version of an agent. Versions are immutable: an update stores
// a new version and moves LatestVersion.
type Agent struct {
	ID            string
	Version       int64
	LatestVersion int64
	Name          string
	// Spec is everything else the API returns for the version, in the API's
	// resolved form; the store does not look inside.
	Spec      json.RawMessage
	CreatedAt time.Time
	// UpdatedAt is when this version was made (for the latest version, when
	// the agent last changed, archiving included).
	UpdatedAt  time.Time
	ArchivedAt *time.Time
}

// AgentListOptions filter and page Agents.List.
type AgentListOptions struct {
	CreatedGte, CreatedLte *time.Time
	IncludeArchived        bool
	Limit                  int
	// After continues a listing after this key (newest first).
	After *Key
}

// Agents stores a tenant's agents and their versions.
type Agents struct{ s *Store }

// Agents returns the agent repository.
func (s *Store) Agents() Agents { return Agents{s} }

// Create stores a new agent at version 1.
func (r Agents) Create(ctx context.Context, name string, spec json.RawMessage) (Agent, error) {
	var a Agent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.CreateAgent(ctx, db.CreateAgentParams{TenantID: tid, ID: newID(AgentIDPrefix)})
		if err != nil {
			return translate(err, "agent")
		}
		v, err := q.InsertAgentVersion(ctx, db.InsertAgentVersionParams{
			TenantID: tid, AgentID: row.ID, Version: 1, Name: name, Spec: spec,
		})
		if err != nil {
			return translate(err, "agent version")
		}
		a = agentFromRows(row, v)
		return nil
	})
	return a, err
}

// Get returns version of agent id, or its latest version when version is 0.
func (r Agents) Get(ctx context.Context, id string, version int64) (Agent, error) {
	var a Agent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		a, err = getAgent(ctx, q, tid, id, version)
		return err
	})
	return a, err
}

// getAgent reads version of tenant tid's agent id (0: the latest).
func getAgent(ctx context.Context, q *db.Queries, tid, id string, version int64) (Agent, error) {
	p := db.GetAgentVersionParams{TenantID: tid, ID: id}
	if version != 0 {
		p.Version = pgtype.Int8{Int64: version, Valid: true}
	}
	row, err := q.GetAgentVersion(ctx, p)
	if err != nil {
		if version != 0 && errdefs.IsNotFound(translate(err, "")) {
			if _, err2 := q.GetAgentVersion(ctx, db.GetAgentVersionParams{TenantID: tid, ID: id}); err2 == nil {
				return Agent{}, errdefs.NotFound("agent %s has no version %d", id, version)
			}
		}
		return Agent{}, translate(err, "agent "+id)
	}
	return agentFromRows(row.Agent, row.AgentVersion), nil
}

// Update makes a new version of agent id from its latest one. apply receives
// the latest version and returns the new name and spec; it runs inside the
// transaction that holds the agent's row lock, so a version check in apply
// cannot race. When apply returns what is already stored, no version is made
// and the latest version is returned. Archived agents cannot be updated.
func (r Agents) Update(ctx context.Context, id string, apply func(cur Agent) (name string, spec json.RawMessage, err error)) (Agent, error) {
	var a Agent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.LockAgent(ctx, db.LockAgentParams{TenantID: tid, ID: id}); err != nil {
			return translate(err, "agent "+id)
		}
		cur, err := getAgent(ctx, q, tid, id, 0)
		if err != nil {
			return err
		}
		if cur.ArchivedAt != nil {
			return errdefs.FailedPrecondition("agent %s is archived and cannot be updated", id)
		}
		name, spec, err := apply(cur)
		if err != nil {
			return err
		}
		if name == cur.Name && sameJSON(spec, cur.Spec) {
			a = cur
			return nil
		}
		v, err := q.InsertAgentVersion(ctx, db.InsertAgentVersionParams{
			TenantID: tid, AgentID: id, Version: cur.LatestVersion + 1, Name: name, Spec: spec,
		})
		if err != nil {
			return translate(err, "agent version")
		}
		row, err := q.SetAgentLatestVersion(ctx, db.SetAgentLatestVersionParams{TenantID: tid, ID: id, LatestVersion: v.Version})
		if err != nil {
			return translate(err, "agent "+id)
		}
		a = agentFromRows(row, v)
		return nil
	})
	return a, err
}

// Archive marks agent id archived (terminal; archiving twice is a no-op) and
// returns its latest version.
func (r Agents) Archive(ctx context.Context, id string) (Agent, error) {
	var a Agent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := q.ArchiveAgent(ctx, db.ArchiveAgentParams{TenantID: tid, ID: id}); err != nil {
			return translate(err, "agent "+id)
		}
		var err error
		a, err = getAgent(ctx, q, tid, id, 0)
		return err
	})
	return a, err
}

// List returns the latest version of the tenant's agents, newest first, and
// whether more follow.
func (r Agents) List(ctx context.Context, opts AgentListOptions) ([]Agent, bool, error) {
	n, lim := pageLimit(opts.Limit)
	kc, kid := keyTS(opts.After)
	var out []Agent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListAgents(ctx, db.ListAgentsParams{
			TenantID:   tid,
			CreatedGte: ts(opts.CreatedGte), CreatedLte: ts(opts.CreatedLte),
			IncludeArchived: opts.IncludeArchived,
			BeforeCreated:   kc, BeforeID: kid, Lim: lim,
		})
		if err != nil {
			return translate(err, "agents")
		}
		for _, row := range rows {
			out = append(out, agentFromRows(row.Agent, row.AgentVersion))
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

// ListVersions returns agent id's versions, newest first, below
// beforeVersion when it is not 0, and whether more follow.
func (r Agents) ListVersions(ctx context.Context, id string, limit int, beforeVersion int64) ([]Agent, bool, error) {
	n, lim := pageLimit(limit)
	var out []Agent
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if _, err := getAgent(ctx, q, tid, id, 0); err != nil {
			return err
		}
		p := db.ListAgentVersionsParams{TenantID: tid, ID: id, Lim: lim}
		if beforeVersion != 0 {
			p.BeforeVersion = pgtype.Int8{Int64: beforeVersion, Valid: true}
		}
		rows, err := q.ListAgentVersions(ctx, p)
		if err != nil {
			return translate(err, "agent versions")
		}
		for _, row := range rows {
			out = append(out, agentFromRows(row.Agent, row.AgentVersion))
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

func agentFromRows(a db.Agent, v db.AgentVersion) Agent {
	out := Agent{
		ID:            a.ID,
		Version:       v.Version,
		LatestVersion: a.LatestVersion,
		Name:          v.Name,
		Spec:          json.RawMessage(v.Spec),
		CreatedAt:     a.CreatedAt.Time,
		UpdatedAt:     v.CreatedAt.Time,
		ArchivedAt:    fromTS(a.ArchivedAt),
	}
	if v.Version == a.LatestVersion {
		out.UpdatedAt = a.UpdatedAt.Time
	}
	return out
}
