package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/policy"
)

// caller is a principal the walks try every route and method as.
type caller struct {
	name  string
	key   string
	roles []string
	fleet bool
}

// callers issues one key per role of the policy: tenant roles in the
// default tenant, fleet roles as operator keys.
func callers(t *testing.T, pol *policy.Policy, db *pgtest.DB, issue func(role string) string) []caller {
	t.Helper()
	var out []caller
	for name, r := range pol.Roles {
		c := caller{name: name, roles: []string{name}, fleet: r.Scope == policy.FleetScope}
		if c.fleet {
			c.key = servertest.OperatorKey(t, db, name)
		} else {
			c.key = issue(name)
		}
		out = append(out, c)
	}
	return out
}

func authorizer(t *testing.T) (*policy.Policy, *authz.Authorizer) {
	t.Helper()
	pol, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	z, err := authz.New(pol)
	if err != nil {
		t.Fatal(err)
	}
	return pol, z
}

// Every public route refuses a request without credentials (401) and a
// request whose principal lacks the route's permission (403), and lets the
// others through (to whatever the handler answers for a made-up id).
func TestEveryRouteChecksItsRole(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	pol, z := authorizer(t)
	cs := callers(t, pol, db, func(role string) string { return servertest.TenantKey(t, srv, tenant.Default, role) })
	unlimitedRate(t, db)
	base := "http://" + srv.HTTPAddr()
	if len(publicapi.Rules) < 21 {
		t.Fatalf("only %d routes in the table", len(publicapi.Rules))
	}
	for pattern, rule := range publicapi.Rules {
		method, path, _ := strings.Cut(pattern, " ")
		path = strings.NewReplacer("{id}", "x_1", "{session_id}", "sesn_x1", "{resource_id}", "sesrsc_x1", "{memory_id}", "mem_x1", "{version_id}", "memver_x1", "{version}", "skillver_x1").Replace(path)
		send := func(key string) (int, string) {
			req, err := http.NewRequest(method, base+path, strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			if key != "" {
				req.Header.Set("x-api-key", key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096)) // streams: the head is enough
			return resp.StatusCode, string(b)
		}
		if code, body := send(""); code != 401 || !strings.Contains(body, "authentication_error") {
			t.Errorf("%s without credentials: %d %s", pattern, code, body)
		}
		for _, c := range cs {
			p := auth.Principal{Subject: c.name, Roles: c.roles}
			if !c.fleet {
				p.Tenant = tenant.Default
			}
			allowed := z.Check(p, rule) == nil
			code, body := send(c.key)
			switch {
			case !allowed && (code != 403 || !strings.Contains(body, "permission_error")):
				t.Errorf("%s as %s (not allowed): %d %s", pattern, c.name, code, body)
			case allowed && (code == 401 || code == 403 || strings.Contains(body, "no route for")):
				t.Errorf("%s as %s (allowed): %d %s", pattern, c.name, code, body)
			}
		}
	}
}

// unlimitedRate lifts the default tenant's request rate: a walk sends a
// request per route or method per role, more than the default burst, and
// the rate limit is not what it tests.
func unlimitedRate(t *testing.T, db *pgtest.DB) {
	t.Helper()
	su, err := pgx.Connect(context.Background(), db.SuperuserURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = su.Exec(context.Background(), `INSERT INTO tenant_quotas (tenant_id, requests_per_second, request_burst) VALUES ('tenant_default', 10000, 10000)
		ON CONFLICT (tenant_id) DO UPDATE SET requests_per_second = 10000, request_burst = 10000`)
	su.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
}

// Every method the gRPC server serves has a rule, refuses a call without
// credentials and a call whose principal lacks the rule's permission.
func TestEveryAdminMethodChecksItsRole(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	pol, z := authorizer(t)
	cs := callers(t, pol, db, func(role string) string { return servertest.TenantKey(t, srv, tenant.Default, role) })
	unlimitedRate(t, db)
	methods := srv.GRPCMethods()
	if len(methods) < 13 {
		t.Fatalf("only %d methods registered: %v", len(methods), methods)
	}
	anon := dial(t, srv.GRPCAddr())
	for _, m := range methods {
		rule, ok := authz.MethodRule(m)
		if !ok {
			t.Errorf("%s has no rule in authz.Methods", m)
		}
		err := anon.Invoke(context.Background(), m, &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without credentials: %v", m, err)
		}
		for _, c := range cs {
			p := auth.Principal{Subject: c.name, Roles: c.roles}
			if !c.fleet {
				p.Tenant = tenant.Default
			}
			allowed := ok && z.Check(p, rule) == nil
			if strings.HasSuffix(m, "/DeleteTenant") && allowed {
				continue // an empty request would be refused anyway; not worth the risk
			}
			err := dial(t, srv.GRPCAddr(), c.key).Invoke(context.Background(), m, &emptypb.Empty{}, &emptypb.Empty{})
			code := status.Code(err)
			switch {
			case !allowed && code != codes.PermissionDenied:
				t.Errorf("%s as %s (not allowed): %v", m, c.name, err)
			case allowed && (code == codes.PermissionDenied || code == codes.Unauthenticated):
				t.Errorf("%s as %s (allowed): %v", m, c.name, err)
			}
		}
	}
}

// The gateway forwards both ways of sending a key, and the admin REST API
// answers refusals in the error envelope.
func TestAdminRESTCredentials(t *testing.T) {
	db := pgtest.New(t)
	srv := setup(t, db)
	op := servertest.OperatorKey(t, db)
	url := "http://" + srv.HTTPAddr() + "/admin/v1/tenants"
	for _, h := range [][2]string{{"x-api-key", op}, {"Authorization", "Bearer " + op}} {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set(h[0], h[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Tenants []struct {
				ID string `json:"id"`
			} `json:"tenants"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || len(body.Tenants) != 1 || body.Tenants[0].ID != string(tenant.Default) {
			t.Fatalf("%s: %d %+v %v", h[0], resp.StatusCode, body, err)
		}
	}
	resp, b := get(t, url)
	if resp.StatusCode != 401 {
		t.Fatalf("no key: %d %s", resp.StatusCode, b)
	}
	checkEnvelope(t, resp, b, "authentication_error")
	resp, b = get(t, url, servertest.TenantKey(t, srv, tenant.Default))
	if resp.StatusCode != 403 {
		t.Fatalf("tenant key on a fleet route: %d %s", resp.StatusCode, b)
	}
	checkEnvelope(t, resp, b, "permission_error")
}

// A policy naming an action nobody defined refuses to start the node; so
// does an OIDC issuer mapping a group to a role the policy lacks.
func TestBadPolicyRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"roles.yaml":    "actions:\n  tenant: [agents:read]\n  fleet: [hosts:read]\nroles:\n  admin:\n    scope: tenant\n    permissions: [agents:read, rockets:launch]\n",
		"quotas.yaml":   "default_quota: {concurrent_sessions: 1, concurrent_sandboxes: 1, cpu_millis: 1, memory_mib: 1, requests_per_second: 1, request_burst: 1}\n",
		"runtimes.yaml": "runtimes:\n  gvisor: {cpu_millis: 1, memory_mib: 1, pids: 1, disk_mib: 1, default_exec_timeout_seconds: 1, exec_timeout_seconds: 1, output_limit_bytes: 1}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	db := pgtest.New(t)
	cfg := server.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", HostAddr: "127.0.0.1:0", DatabaseURL: db.AppURL, DataDir: t.TempDir(), Bootstrap: true,
		RaftAddr: "127.0.0.1:0", RaftHTTPAddr: "127.0.0.1:0", PolicyDir: dir}
	if _, err := server.New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "rockets:launch") {
		t.Fatalf("bad policy: %v", err)
	}
	cfg.PolicyDir = ""
	cfg.OIDCIssuers = []auth.IssuerConfig{{Issuer: "https://idp", Audience: "corral", TenantClaim: "org", GroupRoles: map[string][]string{"eng": {"wizard"}}}}
	if _, err := server.New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "wizard") {
		t.Fatalf("bad issuer roles: %v", err)
	}
}
