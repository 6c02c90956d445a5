package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/authz"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/policy"
)

// fakeKeys knows one operator key and one tenant key.
type fakeKeys struct{}

const (
	opKey     = "sk-corral-operator"
	tenantKey = "sk-corral-tenant"
)

func (fakeKeys) Authenticate(_ context.Context, s logging.Secret) (store.KeyIdentity, error) {
	switch s.Reveal() {
	case opKey:
		return store.KeyIdentity{KeyID: "key_op", Principal: "operator:test", Roles: []string{"operator"}, LastUsedAt: time.Now()}, nil
	case tenantKey:
		return store.KeyIdentity{TenantID: "tenant_a", KeyID: "key_t", Principal: "key:t", Roles: []string{"admin"}, LastUsedAt: time.Now()}, nil
	}
	return store.KeyIdentity{}, errdefs.NotFound("no key")
}

func (fakeKeys) Touch(context.Context, tenant.ID, string) error { return nil }

type noOverrides struct{}

func (noOverrides) Get(context.Context) (store.QuotaOverride, error) {
	return store.QuotaOverride{}, nil
}

func testSecurity(t *testing.T, rps, burst int) *Security {
	t.Helper()
	pol, err := policy.Load()
	if err != nil {
		t.Fatal(err)
	}
	pol.DefaultQuota.RequestsPerSecond, pol.DefaultQuota.RequestBurst = rps, burst
	z, err := authz.New(pol)
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{Keys: fakeKeys{}, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return &Security{Authn: a, Authz: z, Quotas: quota.New(pol.DefaultQuota, noOverrides{}, nil)}
}

// A service the authorization table does not list is refused, even to an
// operator: closed by default.
func TestUnlistedMethodIsRefused(t *testing.T) {
	srv := NewGRPCServer(logging.Discard(), testSecurity(t, 100, 100))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, ok := authz.MethodRule("/grpc.health.v1.Health/Check"); ok {
		t.Fatal("the health service is in the table; pick another unlisted service")
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", opKey)
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "no authorization rule") {
		t.Fatalf("unlisted method as an operator: %v", err)
	}
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unlisted method without a key: %v", err)
	}
	// Streaming methods go through the same checks.
	for name, c := range map[string]context.Context{"operator": ctx, "anonymous": context.Background()} {
		w, err := healthpb.NewHealthClient(conn).Watch(c, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		want := codes.PermissionDenied
		if name == "anonymous" {
			want = codes.Unauthenticated
		}
		if status.Code(err) != want {
			t.Fatalf("unlisted stream as %s: %v, want %v", name, err, want)
		}
	}
}

// Credentials that are malformed, too long, unknown or of the wrong scheme
// are refused with 401 before anything else happens; a tenant over its rate
// gets 429 with retry-after.
func TestAuthenticateMiddleware(t *testing.T) {
	sec := testSecurity(t, 1, 2)
	h := withRequestContext(logging.Discard(), nil, nil, sec.Authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := auth.From(r.Context())
		id, _ := tenant.From(r.Context())
		_, _ = w.Write([]byte(p.Subject + " " + string(id)))
	})))
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(hdr ...string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/agents", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for name, hdr := range map[string][]string{
		"none":            nil,
		"unknown key":     {"x-api-key", "sk-corral-nope"},
		"no prefix":       {"x-api-key", "sk-ant-api03-abc"},
		"bad characters":  {"x-api-key", "sk-corral-a b'c"},
		"basic auth":      {"Authorization", "Basic dXNlcjpwYXNz"},
		"empty bearer":    {"Authorization", "Bearer "},
		"not a jwt":       {"Authorization", "Bearer abc.def"},
		"jwt of nobody":   {"Authorization", "Bearer eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJodHRwczovL2V2aWwifQ.c2ln"},
		"garbage payload": {"Authorization", "Bearer a.%%%.c"},
		"huge key":        {"x-api-key", "sk-corral-" + strings.Repeat("a", 64<<10)},
		"huge bearer":     {"Authorization", "Bearer " + strings.Repeat("a", 64<<10)},
	} {
		resp, body := do(hdr...)
		if resp.StatusCode != 401 || !strings.Contains(body, `"authentication_error"`) {
			t.Errorf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
	if resp, body := do("Authorization", "Bearer "+tenantKey); resp.StatusCode != 200 || body != "key:t tenant_a" {
		t.Fatalf("bearer key: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("x-api-key", opKey); resp.StatusCode != 200 || body != "operator:test " {
		t.Fatalf("operator key: %d %s", resp.StatusCode, body)
	}
	// Burst 2 at 1/s: the bearer request above took one token.
	var limited *http.Response
	for range 5 {
		resp, _ := do("x-api-key", tenantKey)
		if resp.StatusCode == 429 {
			limited = resp
			break
		}
	}
	if limited == nil || limited.Header.Get("retry-after") == "" || limited.Header.Get("x-should-retry") != "" {
		t.Fatalf("no 429 with retry-after: %+v", limited)
	}
}
