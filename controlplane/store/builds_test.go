package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// A build's life in the store: asked for (once per key), claimed by one
// builder, its progress and end recorded; a failed one asked for again
// after the retry delay; a stale one claimable again; every row its
// tenant's only.
func TestBuilds(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	def := tenant.With(ctx, tenant.Default)
	b := store.Build{Key: strings.Repeat("a", 64), Image: "corral.build/packages:a", BaseImage: "base:1",
		Packages: []byte(`{"apt":["curl"]}`), Mirrors: []byte(`{"apt":"http://deb.test/ ./"}`), EnvironmentID: "env_1"}
	got, err := s.Builds().Request(def, b, time.Hour)
	if err != nil || got.Status != store.BuildPending || got.Image != b.Image || got.EnvironmentID != "env_1" || got.CreatedAt.IsZero() {
		t.Fatalf("Request = %+v, %v", got, err)
	}
	// Asking again (another environment with the same content) changes nothing.
	b2 := b
	b2.EnvironmentID = "env_2"
	if again, err := s.Builds().Request(def, b2, time.Hour); err != nil || again.EnvironmentID != "env_1" || again.Status != store.BuildPending {
		t.Fatalf("second Request = %+v, %v", again, err)
	}
	refs, err := s.ClaimableBuilds(ctx, time.Now().Add(-time.Minute), 10)
	if err != nil || len(refs) != 1 || refs[0].TenantID != tenant.Default || refs[0].Key != b.Key {
		t.Fatalf("claimable = %+v, %v", refs, err)
	}
	// Another tenant sees nothing of it and cannot claim it.
	tb := tenant.With(ctx, "tenant_b")
	if _, err := s.Builds().Get(tb, b.Key); !errdefs.IsNotFound(err) {
		t.Fatalf("tenant_b's Get = %v", err)
	}
	if _, err := s.Builds().Claim(tb, b.Key, time.Now()); !errdefs.IsNotFound(err) {
		t.Fatalf("tenant_b's Claim = %v", err)
	}
	c, err := s.Builds().Claim(def, b.Key, time.Now().Add(-time.Minute))
	if err != nil || c.Status != store.BuildBuilding || c.Attempts != 1 || c.StartedAt.IsZero() {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	if _, err := s.Builds().Claim(def, b.Key, time.Now().Add(-time.Minute)); !errdefs.IsNotFound(err) {
		t.Fatalf("a second Claim of a live build = %v", err)
	}
	// A builder that stopped: claimable again once it is stale.
	if refs, _ := s.ClaimableBuilds(ctx, time.Now().Add(time.Minute), 10); len(refs) != 1 {
		t.Fatalf("a stale build is not claimable: %+v", refs)
	}
	if c, err = s.Builds().Claim(def, b.Key, time.Now().Add(time.Minute)); err != nil || c.Attempts != 2 {
		t.Fatalf("reclaim = %+v, %v", c, err)
	}
	long := strings.Repeat("x", store.MaxBuildLog) + "tail"
	if err := s.Builds().Progress(def, b.Key, "host-1", long); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Builds().Get(def, b.Key); p.HostID != "host-1" || len(p.Log) != store.MaxBuildLog || !strings.HasSuffix(p.Log, "tail") {
		t.Fatalf("progress: host %q, log %d bytes", p.HostID, len(p.Log))
	}
	// A build that could not run now goes back to pending.
	if err := s.Builds().Requeue(def, b.Key, "host busy"); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Builds().Get(def, b.Key); r.Status != store.BuildPending || r.Log != "host busy" || !r.StartedAt.IsZero() {
		t.Fatalf("requeued: %+v", r)
	}
	if c, err = s.Builds().Claim(def, b.Key, time.Now().Add(-time.Minute)); err != nil || c.Attempts != 3 {
		t.Fatalf("claim after requeue = %+v, %v", c, err)
	}
	fail := c
	fail.Status, fail.Error, fail.HostID = store.BuildFailed, "step apt failed (exit 100)", "host-1"
	if err := s.Builds().Finish(def, fail); err != nil {
		t.Fatal(err)
	}
	if f, _ := s.Builds().Get(def, b.Key); f.Status != store.BuildFailed || f.Error != fail.Error || f.FinishedAt.IsZero() {
		t.Fatalf("failed: %+v", f)
	}
	if refs, _ := s.ClaimableBuilds(ctx, time.Now().Add(time.Minute), 10); len(refs) != 0 {
		t.Fatalf("a failed build is claimable: %+v", refs)
	}
	// Within the retry delay a failed build stays failed; past it, it is
	// pending again.
	if r, err := s.Builds().Request(def, b, time.Hour); err != nil || r.Status != store.BuildFailed {
		t.Fatalf("Request within the retry delay = %+v, %v", r, err)
	}
	if r, err := s.Builds().Request(def, b, -time.Second); err != nil || r.Status != store.BuildPending || r.Error != "" {
		t.Fatalf("Request past the retry delay = %+v, %v", r, err)
	}
	c, _ = s.Builds().Claim(def, b.Key, time.Now())
	c.Status, c.HostID, c.Digest, c.LayerBytes, c.BlobKey = store.BuildReady, "host-2", "sha256:abc", 1234, "images/x.tar"
	if err := s.Builds().Finish(def, c); err != nil {
		t.Fatal(err)
	}
	list, err := s.Builds().List(def, "", 10)
	if err != nil || len(list) != 1 || list[0].Status != store.BuildReady || list[0].Digest != "sha256:abc" || list[0].LayerBytes != 1234 || list[0].HostID != "host-2" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if bl, err := s.Builds().List(tb, "", 10); err != nil || len(bl) != 0 {
		t.Fatalf("tenant_b's List = %+v, %v", bl, err)
	}
	if err := s.Builds().Finish(def, store.Build{Key: b.Key, Status: store.BuildBuilding}); err == nil {
		t.Fatal("Finish took a status that is not an end")
	}
}

// The builder's queue takes tenants in turns, and a tenant may have only
// MaxOpenBuilds builds waiting or running.
func TestBuildQueueIsFair(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	if _, err := s.Tenants().Create(ctx, "tenant_b", "b"); err != nil {
		t.Fatal(err)
	}
	def, tb := tenant.With(ctx, tenant.Default), tenant.With(ctx, "tenant_b")
	build := func(i int) store.Build {
		k := fmt.Sprintf("%064d", i)
		return store.Build{Key: k, Image: "corral.build/packages:" + k, BaseImage: "base:1", Packages: []byte(`{}`), Mirrors: []byte(`{}`), EnvironmentID: "env"}
	}
	// The default tenant asks for all it may, then tenant_b for one.
	for i := range store.MaxOpenBuilds {
		if _, err := s.Builds().Request(def, build(i), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Builds().Request(def, build(100), time.Hour); errdefs.KindOf(err) != errdefs.ResourceExhaustedKind {
		t.Fatalf("a build past the tenant's bound: %v", err)
	}
	// Asking again for one it has is no new build.
	if _, err := s.Builds().Request(def, build(0), time.Hour); err != nil {
		t.Fatalf("asking again past the bound: %v", err)
	}
	if _, err := s.Builds().Request(tb, build(200), time.Hour); err != nil {
		t.Fatal(err)
	}
	refs, err := s.ClaimableBuilds(ctx, time.Now().Add(-time.Minute), 3)
	if err != nil || len(refs) != 3 {
		t.Fatalf("claimable = %+v, %v", refs, err)
	}
	// tenant_b's only build comes second, not after the default tenant's
	// sixteen.
	if refs[0].TenantID != tenant.Default || refs[1].TenantID != "tenant_b" || refs[2].TenantID != tenant.Default {
		t.Fatalf("claim order %+v", refs)
	}
}

// The sweep finds finished builds no session pins and nobody asked for
// lately, and deletes one only while that still holds.
func TestBuildSweep(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db.AppURL)
	ctx := context.Background()
	def := tenant.With(ctx, tenant.Default)
	mk := func(k, status string) {
		t.Helper()
		b := store.Build{Key: k, Image: "corral.build/packages:" + k, BaseImage: "base:1", Packages: []byte(`{}`), Mirrors: []byte(`{}`), EnvironmentID: "env_1"}
		if _, err := s.Builds().Request(def, b, time.Hour); err != nil {
			t.Fatal(err)
		}
		if status == store.BuildPending {
			return
		}
		c, err := s.Builds().Claim(def, k, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		c.Status, c.BlobKey = status, "builds/"+k+".tar"
		if err := s.Builds().Finish(def, c); err != nil {
			t.Fatal(err)
		}
	}
	ready, failed, pending, pinned := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64), strings.Repeat("d", 64)
	mk(ready, store.BuildReady)
	mk(failed, store.BuildFailed)
	mk(pending, store.BuildPending)
	mk(pinned, store.BuildReady)
	exec(t, db.SuperuserURL, `INSERT INTO agents (tenant_id, id, latest_version) VALUES ('tenant_default', 'agent_a', 1)`)
	exec(t, db.SuperuserURL, `INSERT INTO agent_versions (tenant_id, agent_id, version, name, spec) VALUES ('tenant_default', 'agent_a', 1, 'a', '{}')`)
	exec(t, db.SuperuserURL, `INSERT INTO environments (tenant_id, id, name, config) VALUES ('tenant_default', 'env_1', 'a', '{}')`)
	exec(t, db.SuperuserURL, `INSERT INTO sessions (tenant_id, id, agent_id, agent_version, agent, environment_id, package_build) VALUES ('tenant_default', 'sesn_a', 'agent_a', 1, '{}', 'env_1', '`+pinned+`')`)

	if got, err := s.SweepableBuilds(ctx, time.Now().Add(-time.Hour), 10); err != nil || len(got) != 0 {
		t.Fatalf("builds asked for just now are sweepable: %+v, %v", got, err)
	}
	later := time.Now().Add(time.Minute)
	got, err := s.SweepableBuilds(ctx, later, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("sweepable = %+v, %v; want the ready and the failed one", got, err)
	}
	for _, b := range got {
		if b.Key != ready && b.Key != failed || b.BlobKey != "builds/"+b.Key+".tar" || b.Image != "corral.build/packages:"+b.Key || b.TenantID != tenant.Default {
			t.Fatalf("sweepable build %+v", b)
		}
	}
	// Asked for again (a new session of its environment): kept.
	if b, err := s.Builds().Request(def, store.Build{Key: ready, Image: "x", BaseImage: "x", Packages: []byte(`{}`), Mirrors: []byte(`{}`)}, time.Hour); err != nil || b.Status != store.BuildReady {
		t.Fatalf("asking again: %+v, %v", b, err)
	}
	if ok, err := s.Builds().Delete(def, ready, time.Now().Add(-time.Second)); err != nil || ok {
		t.Fatalf("deleting a build asked for since: %v, %v", ok, err)
	}
	if ok, err := s.Builds().Delete(def, pinned, later); err != nil || ok {
		t.Fatalf("deleting a pinned build: %v, %v", ok, err)
	}
	if ok, err := s.Builds().Delete(def, failed, later); err != nil || !ok {
		t.Fatalf("deleting an unused build: %v, %v", ok, err)
	}
	if _, err := s.Builds().Get(def, failed); !errdefs.IsNotFound(err) {
		t.Fatalf("the deleted build: %v", err)
	}
}
