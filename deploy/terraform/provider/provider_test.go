package provider

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	tfresource "github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/terraform"

	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// The acceptance tests run the real terraform CLI (terraform-plugin-testing
// drives it against the provider served in process) against a real control
// plane started in process on a fresh database.

func TestMain(m *testing.M) {
	// terraform-plugin-testing runs acceptance tests only with TF_ACC set;
	// these are always meant to run. The CLI must not look for updates or
	// a registry: it finds the provider in process (reattach).
	os.Setenv("TF_ACC", "1")
	// The provider falls back to these; a shell that sourced dev.env must
	// not configure the tests' providers.
	for _, v := range []string{envURL, envGRPCAddr, envAPIKey, envOperatorKey, envTLSCA} {
		os.Unsetenv(v)
	}
	os.Setenv("CHECKPOINT_DISABLE", "1")
	os.Setenv("TF_IN_AUTOMATION", "1")
	if tf, err := exec.LookPath("terraform"); err == nil {
		// Set, so that the harness never downloads a terraform.
		os.Setenv("TF_ACC_TERRAFORM_PATH", tf)
	}
	// The user's CLI configuration (provider_installation, dev_overrides)
	// must not change what the tests run: an empty one replaces it.
	dir, err := os.MkdirTemp("", "corral-tf-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cli := filepath.Join(dir, "terraformrc")
	if err := os.WriteFile(cli, nil, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("TF_CLI_CONFIG_FILE", cli)
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// testEnv is a control plane and the keys the tests configure the provider
// with: an operator key and an admin key of tenant.Default.
type testEnv struct {
	srv         *server.Server
	operatorKey string
	apiKey      string
	// c is a client as the provider's own: the tests change things
	// behind Terraform's back through the same APIs.
	c *client
}

func setup(t *testing.T) *testEnv {
	t.Helper()
	return setupWith(t, server.Config{NodeID: "tf-test"}, nil)
}

// setupWith starts the node with cfg; roots, when set, is the CA the
// test's own client trusts (a node serving TLS).
func setupWith(t *testing.T, cfg server.Config, roots *x509.CertPool) *testEnv {
	t.Helper()
	if os.Getenv("TF_ACC_TERRAFORM_PATH") == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("terraform is not on PATH: the provider's acceptance tests need the terraform CLI (1.11 or later)")
		}
		t.Skip("terraform is not on PATH: the provider's acceptance tests need the terraform CLI (1.11 or later)")
	}
	db := pgtest.New(t)
	srv := servertest.Start(t, db, cfg)
	e := &testEnv{srv: srv, operatorKey: servertest.OperatorKey(t, db), apiKey: servertest.TenantKey(t, srv, tenant.Default)}
	conn, err := dialAdmin(srv.GRPCAddr(), roots, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc, base, err := restClient(srv.HTTPAddr(), roots, false)
	if err != nil {
		t.Fatal(err)
	}
	e.c = &client{conn: conn, operatorKey: e.operatorKey, http: hc, restURL: base, apiKey: e.apiKey}
	return e
}

func (e *testEnv) factories() map[string]func() (tfprotov6.ProviderServer, error) {
	return map[string]func() (tfprotov6.ProviderServer, error){
		"corral": providerserver.NewProtocol6WithError(New("test")()),
	}
}

// config is cfg after a provider block that reaches e's node.
func (e *testEnv) config(cfg string) string {
	return fmt.Sprintf(`
provider "corral" {
  url          = "http://%s"
  grpc_addr    = "%s"
  operator_key = %q
  api_key      = %q
}
`, e.srv.HTTPAddr(), e.srv.GRPCAddr(), e.operatorKey, e.apiKey) + cfg
}

// admin runs fn on the admin API, failing the test on an error.
func admin[T any](t *testing.T, e *testEnv, fn func(ctx context.Context, c adminv1.TenantsServiceClient) (T, error)) T {
	t.Helper()
	out, err := adminCall(context.Background(), e.c, func(ctx context.Context) (T, error) { return fn(ctx, e.c.tenants()) })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stateAttr is the attribute of a resource in s.
func stateAttr(s *terraform.State, name, key string) (string, error) {
	rs, ok := s.RootModule().Resources[name]
	if !ok {
		return "", fmt.Errorf("%s is not in the state", name)
	}
	return rs.Primary.Attributes[key], nil
}

// keyWorks checks that the secret of an API key resource is accepted by
// the REST API.
func keyWorks(e *testEnv, name string) tfresource.TestCheckFunc {
	return func(s *terraform.State) error {
		secret, err := stateAttr(s, name, "secret")
		if err != nil {
			return err
		}
		if secret == "" {
			return fmt.Errorf("%s has no secret", name)
		}
		c := *e.c
		c.apiKey = secret
		return c.rest(context.Background(), http.MethodGet, "/v1/agents", nil, nil)
	}
}
