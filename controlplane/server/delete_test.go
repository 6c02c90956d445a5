package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/waitfor"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// reaper records which tenants' sandboxes it was asked to destroy.
type reaper struct {
	mu      sync.Mutex
	tenants []tenant.ID
}

func (r *reaper) DestroyTenantSandboxes(_ context.Context, id tenant.ID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenants = append(r.tenants, id)
	return nil
}

// A tenant deleted while one of its sessions runs a turn: its event stream
// ends, its loop stops, its sandboxes are destroyed, its key stops working,
// nothing of it remains in any table, and the other tenant is untouched.
func TestDeleteTenantWhileItsSessionRuns(t *testing.T) {
	db := pgtest.New(t)
	rp := &reaper{}
	srv := servertest.Start(t, db, server.Config{NodeID: "node-a", SandboxReaper: rp})
	base := "http://" + srv.HTTPAddr()
	goneKey := servertest.TenantKey(t, srv, "tenant_gone")
	stayKey := servertest.TenantKey(t, srv, tenant.Default)
	gone, stay := withKey(goneKey), withKey(stayKey)

	admin := adminv1.NewTenantsServiceClient(dial(t, srv.GRPCAddr(), servertest.OperatorKey(t, db)))
	var sessions [2]string
	for i, cl := range []*http.Client{gone, stay} {
		agent := postJSON(t, cl, base+"/v1/agents", map[string]any{"name": "a", "model": "fake"})
		env := postJSON(t, cl, base+"/v1/environments", map[string]any{"name": "e"})
		sessions[i] = postJSON(t, cl, base+"/v1/sessions", map[string]any{"agent": agent["id"], "environment_id": env["id"]})["id"].(string)
	}
	// The audit log's writer is asynchronous: the other tenant's rows are
	// all there once its three writes above are audited.
	waitfor.State(t, 30*time.Second, "the other tenant's three writes audited", func() (bool, string) {
		resp, err := admin.ListAuditLog(context.Background(), &adminv1.ListAuditLogRequest{TenantId: string(tenant.Default)})
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Records) >= 3, fmt.Sprintf("%d records", len(resp.Records))
	})
	before := db.TenantRows(t, string(tenant.Default))

	stream, err := gone.Get(base + "/v1/sessions/" + sessions[0] + "/events/stream?beta=true&event_deltas[]=agent.message")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	frames := sseFrames(stream.Body)
	postJSON(t, gone, base+"/v1/sessions/"+sessions[0]+"/events?beta=true", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "!stream 20000"}}},
	}})
	// Wait until the turn is streaming: the session is running.
	for waitfor.Chan(t, 30*time.Second, "the turn to stream", frames).event != "event_delta" {
	}
	if srv.ActiveLoops() == 0 {
		t.Fatal("no session loop runs while the turn streams")
	}

	start := time.Now()
	if _, err := admin.DeleteTenant(context.Background(), &adminv1.DeleteTenantRequest{TenantId: "tenant_gone"}); err != nil {
		t.Fatalf("DeleteTenant: %v", err)
	}
	t.Logf("deleted in %v", time.Since(start))

	waitfor.Closed(t, 30*time.Second, "the deleted tenant's event stream to end", frames)
	// The loop stops: this node cancels it (agentloop.Pool.StopTenant; a
	// real model call ends at once, the offline fake finishes its stream
	// first), and a loop on another node finds its session gone at its next
	// step.
	waitfor.State(t, 60*time.Second, "the deleted tenant's session loop to stop", func() (bool, string) {
		n := srv.ActiveLoops()
		return n == 0, fmt.Sprintf("%d loops", n)
	})
	t.Logf("loop stopped %v after the delete", time.Since(start))
	rp.mu.Lock()
	if len(rp.tenants) != 1 || rp.tenants[0] != "tenant_gone" {
		t.Errorf("sandbox reaper calls: %v", rp.tenants)
	}
	rp.mu.Unlock()
	if n := db.TenantRows(t, "tenant_gone"); n != 0 {
		t.Fatalf("%d rows of the deleted tenant remain", n)
	}
	if n := db.TenantRows(t, string(tenant.Default)); n != before {
		t.Fatalf("the other tenant's rows went from %d to %d", before, n)
	}
	resp, err := gone.Get(base + "/v1/agents")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("the deleted tenant's key: %d", resp.StatusCode)
	}
	postJSON(t, stay, base+"/v1/sessions/"+sessions[1]+"/events?beta=true", map[string]any{"events": []any{
		map[string]any{"type": "user.message", "content": []any{map[string]any{"type": "text", "text": "still here"}}},
	}})
	if _, err := admin.GetTenant(context.Background(), &adminv1.GetTenantRequest{TenantId: "tenant_gone"}); err == nil {
		t.Fatal("the tenant is still there")
	}
}
