package server_test

import (
	"net/http"
	"testing"

	"corral.dev/corral/controlplane/fleet"
	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/test/fleettest"
)

// The fleet's session ports over PostgreSQL pass the conformance body the
// in-memory ones in test/fleettest pass.
func TestFleetPortsConformance(t *testing.T) {
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "n1", SandboxRuntime: admission.RuntimeProcess})
	startHost(t, srv, "h1") // sessions of a sandboxed agent need a host offering their class
	base := "http://" + srv.HTTPAddr()
	c := withKey(servertest.TenantKey(t, srv, tenant.Default))
	ag := postJSON(t, c, base+"/v1/agents", map[string]any{"name": "ports", "model": "fake",
		"tools": []any{map[string]any{"type": "agent_toolset_20260401"}}})
	env := postJSON(t, c, base+"/v1/environments", map[string]any{"name": "ports"})
	sessions, notices := srv.FleetPorts()
	fleettest.CheckSessions(t, fleettest.SessionRecords{Sessions: sessions, Notices: notices,
		Create: func(t *testing.T) (tenant.ID, string) {
			return tenant.Default, postJSON(t, c, base+"/v1/sessions", map[string]any{"agent": ag["id"], "environment_id": env["id"]})["id"].(string)
		},
		Delete: func(t *testing.T, _ tenant.ID, id string) {
			req, _ := http.NewRequest("DELETE", base+"/v1/sessions/"+id, nil)
			resp, err := c.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("DELETE %s: %v %v", id, resp, err)
			}
			resp.Body.Close()
		},
		Archive: func(t *testing.T, _ tenant.ID, id string) {
			postJSON(t, c, base+"/v1/sessions/"+id+"/archive", nil)
		},
	})
	// The sweep counts on session ids having the prefix the fleet knows.
	if store.SessionIDPrefix != fleet.SessionIDPrefix {
		t.Fatalf("session ids start with %q, the fleet sweeps %q", store.SessionIDPrefix, fleet.SessionIDPrefix)
	}
}
