package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"corral.dev/corral/controlplane/store/internal/db"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/textcut"
)

// Build statuses.
const (
	BuildPending  = "pending"
	BuildBuilding = "building"
	BuildReady    = "ready"
	BuildFailed   = "failed"
)

// Bounds on what a build's row keeps: its log's tail and its error.
const (
	MaxBuildLog   = 64 << 10
	maxBuildError = 4 << 10
)

// Build is one environment package build (envbuild): the image made from
// a set of packages, by content key.
type Build struct {
	TenantID      tenant.ID
	Key           string
	Image         string
	BaseImage     string
	Packages      []byte // envbuild.Packages, JSON
	Mirrors       []byte // manager -> mirror spec, JSON
	EnvironmentID string
	Status        string
	Error         string
	Log           string
	HostID        string
	Digest        string
	LayerBytes    int64
	BlobKey       string
	Attempts      int
	CreatedAt     time.Time
	StartedAt     time.Time // zero: not started
	FinishedAt    time.Time // zero: not finished
}

func buildOf(r db.EnvironmentBuild) Build {
	return Build{
		TenantID: tenant.ID(r.TenantID), Key: r.Key, Image: r.Image, BaseImage: r.BaseImage, Packages: r.Packages, Mirrors: r.Mirrors,
		EnvironmentID: r.EnvironmentID, Status: r.Status, Error: r.Error, Log: r.Log, HostID: r.HostID, Digest: r.Digest,
		LayerBytes: r.LayerBytes, BlobKey: r.BlobKey, Attempts: int(r.Attempts),
		CreatedAt: r.CreatedAt.Time, StartedAt: r.StartedAt.Time, FinishedAt: r.FinishedAt.Time,
	}
}

// Builds are the environment package builds.
type Builds struct{ s *Store }

// Builds returns the builds' repository.
func (s *Store) Builds() Builds { return Builds{s} }

// MaxOpenBuilds bounds a tenant's builds waiting or running: past it a
// new one is refused (ResourceExhausted) until some end, so one tenant's
// environments cannot fill the builder's queue.
const MaxOpenBuilds = 16

// Request asks for the build of b.Key in the caller's tenant: a new one
// is stored pending; one that failed at least retryAfter ago is made
// pending again; any other is returned as it is. A tenant with
// MaxOpenBuilds builds pending or running is refused a new one.
func (r Builds) Request(ctx context.Context, b Build, retryAfter time.Duration) (Build, error) {
	var out Build
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		if cur, err := q.GetBuild(ctx, db.GetBuildParams{TenantID: tid, Key: b.Key}); err == nil && cur.Status != BuildFailed {
			out = buildOf(cur) // there, and left as it is: asked for now
			return translate(q.TouchBuild(ctx, db.TouchBuildParams{TenantID: tid, Key: b.Key}), "environment build")
		}
		open, err := q.CountOpenBuilds(ctx, tid)
		if err != nil {
			return translate(err, "environment builds")
		}
		if open >= MaxOpenBuilds {
			return errdefs.ResourceExhausted("this tenant has %d package builds waiting or running, the most it may have: try again once they are done (corral builds ls)", open)
		}
		row, err := q.RequestBuild(ctx, db.RequestBuildParams{TenantID: tid, Key: b.Key, Image: b.Image, BaseImage: b.BaseImage,
			Packages: b.Packages, Mirrors: b.Mirrors, EnvironmentID: b.EnvironmentID, RetrySeconds: retryAfter.Seconds()})
		if errors.Is(err, pgx.ErrNoRows) { // there, and left as it is
			row, err = q.GetBuild(ctx, db.GetBuildParams{TenantID: tid, Key: b.Key})
		}
		if err != nil {
			return translate(err, "environment build")
		}
		out = buildOf(row)
		return nil
	})
	return out, err
}

// Get returns the caller's tenant's build of key.
func (r Builds) Get(ctx context.Context, key string) (Build, error) {
	var out Build
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.GetBuild(ctx, db.GetBuildParams{TenantID: tid, Key: key})
		if err != nil {
			return translate(err, "environment build")
		}
		out = buildOf(row)
		return nil
	})
	return out, err
}

// List returns the caller's tenant's builds, newest first, at most limit;
// with key, that build only.
func (r Builds) List(ctx context.Context, key string, limit int) ([]Build, error) {
	var out []Build
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		rows, err := q.ListBuilds(ctx, db.ListBuildsParams{TenantID: tid, Key: key, Lim: int32(max(1, min(limit, 1000)))})
		if err != nil {
			return translate(err, "environment builds")
		}
		for _, row := range rows {
			out = append(out, buildOf(row))
		}
		return nil
	})
	return out, err
}

// BuildRef names a build in some tenant.
type BuildRef struct {
	TenantID tenant.ID
	Key      string
}

// Claimable returns, across tenants, up to limit builds the builder may
// start: pending ones, and building ones whose builder last reported
// before staleBefore (through the SECURITY DEFINER function
// claimable_environment_builds).
func (s *Store) ClaimableBuilds(ctx context.Context, staleBefore time.Time, limit int) ([]BuildRef, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, key FROM claimable_environment_builds($1, $2)`, staleBefore, limit)
	if err != nil {
		return nil, fmt.Errorf("looking up builds to run: %w", unavailable(err))
	}
	type ref struct {
		TenantID string `db:"tenant_id"`
		Key      string `db:"key"`
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[ref])
	if err != nil {
		return nil, fmt.Errorf("looking up builds to run: %w", unavailable(err))
	}
	out := make([]BuildRef, 0, len(got))
	for _, g := range got {
		out = append(out, BuildRef{TenantID: tenant.ID(g.TenantID), Key: g.Key})
	}
	return out, nil
}

// Claim marks the caller's tenant's build of key building, if it is
// pending or its builder stopped before staleBefore; errdefs.NotFound if
// another builder has it or it is done.
func (r Builds) Claim(ctx context.Context, key string, staleBefore time.Time) (Build, error) {
	var out Build
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		row, err := q.ClaimBuild(ctx, db.ClaimBuildParams{TenantID: tid, Key: key, StaleBefore: pgtype.Timestamptz{Time: staleBefore, Valid: true}})
		if err != nil {
			return translate(err, "claimable environment build")
		}
		out = buildOf(row)
		return nil
	})
	return out, err
}

// Progress records a running build's log so far and its host.
func (r Builds) Progress(ctx context.Context, key, hostID, log string) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		return translate(q.SetBuildProgress(ctx, db.SetBuildProgressParams{TenantID: tid, Key: key, HostID: hostID, Log: tailOf(log, MaxBuildLog)}), "environment build")
	})
}

// Finish records a running build's end: b's Status (ready or failed),
// Error, Log, HostID, Digest, LayerBytes and BlobKey.
func (r Builds) Finish(ctx context.Context, b Build) error {
	if b.Status != BuildReady && b.Status != BuildFailed {
		return fmt.Errorf("finishing build %s as %q", b.Key, b.Status)
	}
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		return translate(q.FinishBuild(ctx, db.FinishBuildParams{TenantID: tid, Key: b.Key, Status: b.Status,
			Error: textcut.Prefix(b.Error, maxBuildError), Log: tailOf(b.Log, MaxBuildLog), HostID: b.HostID,
			Digest: b.Digest, LayerBytes: b.LayerBytes, BlobKey: b.BlobKey}), "environment build")
	})
}

// Requeue makes a running build pending again: it could not run now.
func (r Builds) Requeue(ctx context.Context, key, log string) error {
	return r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		return translate(q.RequeueBuild(ctx, db.RequeueBuildParams{TenantID: tid, Key: key, Log: tailOf(log, MaxBuildLog)}), "environment build")
	})
}

// StaleBuild is a build the sweep may remove.
type StaleBuild struct {
	TenantID            tenant.ID
	Key, Image, BlobKey string
}

// SweepableBuilds returns, across tenants, up to limit finished builds
// last asked for before requestedBefore that no session pins (through the
// SECURITY DEFINER function sweepable_environment_builds).
func (s *Store) SweepableBuilds(ctx context.Context, requestedBefore time.Time, limit int) ([]StaleBuild, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, key, image, blob_key FROM sweepable_environment_builds($1, $2)`, requestedBefore, limit)
	if err != nil {
		return nil, fmt.Errorf("looking up unused builds: %w", unavailable(err))
	}
	type row struct {
		TenantID string `db:"tenant_id"`
		Key      string `db:"key"`
		Image    string `db:"image"`
		BlobKey  string `db:"blob_key"`
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[row])
	if err != nil {
		return nil, fmt.Errorf("looking up unused builds: %w", unavailable(err))
	}
	out := make([]StaleBuild, 0, len(got))
	for _, g := range got {
		out = append(out, StaleBuild{TenantID: tenant.ID(g.TenantID), Key: g.Key, Image: g.Image, BlobKey: g.BlobKey})
	}
	return out, nil
}

// Delete removes the caller's tenant's build of key if it is still
// unused: last asked for before requestedBefore and pinned by no session.
// It reports whether it did.
func (r Builds) Delete(ctx context.Context, key string, requestedBefore time.Time) (bool, error) {
	var n int64
	err := r.s.inTenant(ctx, func(q *db.Queries, tid string) error {
		var err error
		n, err = q.DeleteBuild(ctx, db.DeleteBuildParams{TenantID: tid, Key: key, RequestedBefore: pgtype.Timestamptz{Time: requestedBefore, Valid: true}})
		return translate(err, "environment build")
	})
	return n > 0, err
}

// tailOf is s's last n bytes at most, cut at a rune start.
func tailOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for i := 0; i < len(s) && i < 4; i++ {
		if s[i]&0xC0 != 0x80 {
			return s[i:]
		}
	}
	return s
}
