package provider

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
)

// TestBadInputs checks that what the API refuses, and what the provider
// refuses before asking, ends as a diagnostic with the reason, not a crash.
func TestBadInputs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	provider := func(settings string) string {
		return fmt.Sprintf("provider \"corral\" {\n%s\n}\n", settings)
	}
	grpc := fmt.Sprintf("grpc_addr = %q\n", e.srv.GRPCAddr())
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: e.factories(),
		Steps: []resource.TestStep{
			{
				Config: e.config(`
resource "corral_tenant" "t" {
  id   = "tenant_bad"
  name = "Bad"
}
resource "corral_tenant_quota" "q" {
  tenant_id    = corral_tenant.t.id
  cpu_millis   = -1
}
`),
				ExpectError: regexp.MustCompile(`quota limits must be above zero`),
			},
			{
				Config: e.config(`
resource "corral_principal" "p" {
  tenant_id = "tenant_nobody"
  name      = "ghost"
}
`),
				ExpectError: regexp.MustCompile(`tenant tenant_nobody not found`),
			},
			{
				Config: e.config(`
resource "corral_tenant" "t" {
  id   = "not-a-tenant-id"
  name = "Bad id"
}
`),
				ExpectError: regexp.MustCompile(`Creating tenant not-a-tenant-id`),
			},
			{
				Config: e.config(`
resource "corral_api_key" "k" {
  tenant_id = "tenant_default"
  name      = "k"
  roles     = ["no-such-role"]
}
`),
				ExpectError: regexp.MustCompile(`role "no-such-role" is not a tenant role of policy/roles\.yaml`),
			},
			{
				Config: e.config(`
resource "corral_agent" "a" {
  name  = ""
  model = "claude-sonnet-4-5"
}
`),
				ExpectError: regexp.MustCompile(`(?s)Creating an agent.*name must not be empty`),
			},
			{
				Config: e.config(`
resource "corral_agent" "a" {
  name  = "a"
  model = "claude-sonnet-4-5"
  tools = "[{type: agent_toolset_20260401}]"
}
`),
				ExpectError: regexp.MustCompile(`tools is not valid JSON: use jsonencode`),
			},
			{
				Config: e.config(`
resource "corral_agent" "a" {
  name  = "a"
  model = "claude-sonnet-4-5"
  tools = jsonencode([{ type = "no_such_tool" }])
}
`),
				ExpectError: regexp.MustCompile(`(?s)Creating an agent.*tools\[0\]`),
			},
			{
				Config: e.config(`
resource "corral_vault" "v" {
  display_name = "${join("", [for i in range(256) : "x"])}"
}
`),
				ExpectError: regexp.MustCompile(`(?s)Creating a vault.*display_name must be at most 255 characters \(got 256\)`),
			},
			{
				Config:      provider(grpc) + `data "corral_cluster" "c" {}`,
				ExpectError: regexp.MustCompile(`no operator key for the admin API: set operator_key`),
			},
			{
				Config:      provider(grpc+`operator_key = "not-a-key"`) + `data "corral_cluster" "c" {}`,
				ExpectError: regexp.MustCompile(`(?s)Reading the cluster's status.*malformed API key`),
			},
			{
				Config:      provider(`grpc_addr = "http://192.0.2.1:8090"`) + `data "corral_cluster" "c" {}`,
				ExpectError: regexp.MustCompile(`refusing to send credentials in plaintext to http://192\.0\.2\.1:8090`),
			},
			{
				Config:      e.config(`ephemeral "corral_host_join_token" "j" { ttl = "-5m" }`),
				ExpectError: regexp.MustCompile(`ttl must be a positive duration`),
			},
			{
				Config:        e.config(`resource "corral_principal" "p" {` + "\n" + `tenant_id = "tenant_default"` + "\n" + `name = "x"` + "\n}"),
				ResourceName:  "corral_principal.p",
				ImportState:   true,
				ImportStateId: "no-slash",
				ExpectError:   regexp.MustCompile(`want <tenant_id>/<id>, got "no-slash"`),
			},
		},
	})
}
