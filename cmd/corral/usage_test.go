package main

import (
	"context"
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// corral usage prints the report as a table, JSON or CSV, for an operator
// (every tenant, or --tenant) and for a tenant's admin (its own).
func TestUsageCommand(t *testing.T) {
	db := pgtest.New(t)
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxRuntime: "process"})
	keyB := servertest.TenantKey(t, srv, "tenant_b")
	ctx := tenant.With(context.Background(), tenant.Default)
	at := time.Now().Truncate(time.Hour).Add(-2 * time.Hour)
	// Written as the node's own meter writes, under its Raft term.
	term := srv.Raft().Term()
	if _, err := srv.Store().Usage().ClaimMeter(ctx, term); err != nil {
		t.Fatal(err)
	}
	if err := srv.Store().Usage().SetSandboxState(ctx, term, "sesn_billed", store.SandboxRunning, "h1", at); err != nil {
		t.Fatal(err)
	}
	if err := srv.Store().Usage().SetSandboxState(ctx, term, "sesn_billed", "", "", at.Add(30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CORRAL_GRPC_ADDR", srv.GRPCAddr())
	t.Setenv("CORRAL_OPERATOR_KEY", servertest.OperatorKey(t, db))

	if out := mustCLI(t, "usage", "--since", "3h"); !strings.Contains(out, "sesn_billed") || !strings.Contains(out, "1800.0") || !strings.HasPrefix(out, "BUCKET") {
		t.Fatalf("usage as a table:\n%s", out)
	}
	out := mustCLI(t, "usage", "--tenant", string(tenant.Default), "--granularity", "hour", "--output", "csv")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) < 2 || recs[0][0] != "bucket_start" || recs[1][2] != "sesn_billed" {
		t.Fatalf("usage as CSV: %v\n%s", err, out)
	}
	// (protojson varies its spacing on purpose: parse it.)
	var r adminv1.ExportUsageResponse
	out = mustCLI(t, "usage", "--output", "json")
	if err := protojson.Unmarshal([]byte(out), &r); err != nil || len(r.GetRows()) != 1 || r.GetRows()[0].GetSessionId() != "sesn_billed" || r.GetRows()[0].GetRunningSeconds() != 1800 {
		t.Fatalf("usage as JSON: %v\n%s", err, out)
	}
	// Another tenant's admin sees an empty report.
	if out := mustCLI(t, "usage", "--api-key", keyB, "--output", "csv"); strings.Contains(out, "sesn_billed") || strings.Count(out, "\n") != 1 {
		t.Fatalf("tenant_b's usage:\n%s", out)
	}
	if _, err := cli(t, "usage", "--output", "yaml"); err == nil {
		t.Fatal("--output yaml was accepted")
	}
	if _, err := cli(t, "usage", "--since", "yesterday"); err == nil || !strings.Contains(err.Error(), "--since") {
		t.Fatalf("--since yesterday: %v", err)
	}
}
