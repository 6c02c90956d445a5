package provider

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// TestBuiltProvider builds cmd/terraform-provider-corral and drives it as
// a user does: the terraform CLI finds it through a dev_overrides CLI
// configuration, the default provider is configured from the environment
// (the names corral dev writes into dev.env), and a second, aliased
// provider takes the API key of a tenant created in the same apply. (The
// in-process harness cannot test that: it serves every provider
// configuration from one provider instance.) A second plan shows no change.
func TestBuiltProvider(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(name string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Env = append(os.Environ(),
			"TF_CLI_CONFIG_FILE="+filepath.Join(dir, "dev.tfrc"),
			envGRPCAddr+"="+e.srv.GRPCAddr(),
			envOperatorKey+"="+e.operatorKey,
			envURL+"=http://"+e.srv.HTTPAddr(),
			envAPIKey+"=",
		)
		err := cmd.Run()
		return out.String(), err
	}
	bin := filepath.Join(dir, "bin")
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, "terraform-provider-corral"), "./cmd/terraform-provider-corral")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the provider: %v\n%s", err, out)
	}
	files := map[string]string{
		"dev.tfrc": fmt.Sprintf(`provider_installation {
  dev_overrides {
    "corral/corral" = %q
  }
  direct {}
}
`, bin),
		"main.tf": `
terraform {
  required_providers {
    corral = { source = "corral/corral" }
  }
}

provider "corral" {}

resource "corral_tenant" "acme" {
  id   = "tenant_acme"
  name = "Acme"
}

resource "corral_api_key" "acme" {
  tenant_id = corral_tenant.acme.id
  name      = "terraform"
}

provider "corral" {
  alias   = "acme"
  api_key = corral_api_key.acme.secret
}

resource "corral_agent" "helper" {
  provider = corral.acme
  name     = "helper"
  model    = "claude-sonnet-4-5"
}

output "agent_id" { value = corral_agent.helper.id }
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := run("terraform", "apply", "-auto-approve", "-input=false", "-no-color"); err != nil {
		t.Fatalf("terraform apply: %v\n%s", err, out)
	}
	out, err := run("terraform", "output", "-raw", "agent_id")
	if err != nil || !strings.HasPrefix(out, "agent_") {
		t.Fatalf("terraform output agent_id: %v\n%s", err, out)
	}
	// The agent is acme's: the default tenant's key cannot see it.
	if err := e.c.rest(ctx, http.MethodGet, "/v1/agents/"+out, nil, nil); !notFound(err) {
		t.Errorf("tenant_default reading acme's agent %s: %v, want not found", out, err)
	}
	// -detailed-exitcode: 0 is no change, 2 is a change.
	if out, err := run("terraform", "plan", "-detailed-exitcode", "-input=false", "-no-color"); err != nil {
		t.Errorf("second plan after apply is not empty: %v\n%s", err, out)
	}
	if out, err := run("terraform", "destroy", "-auto-approve", "-input=false", "-no-color"); err != nil {
		t.Fatalf("terraform destroy: %v\n%s", err, out)
	}
	_, err = adminCall(ctx, e.c, func(ctx context.Context) (*adminv1.GetTenantResponse, error) {
		return e.c.tenants().GetTenant(ctx, &adminv1.GetTenantRequest{TenantId: "tenant_acme"})
	})
	if !notFound(err) {
		t.Errorf("after destroy, GetTenant tenant_acme: %v, want not found", err)
	}
}
