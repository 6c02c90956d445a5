package provider

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
)

const restConfig = `
resource "corral_agent" "a" {
  name   = %[1]q
  model  = "claude-sonnet-4-5"
  system = %[2]q
  tools  = jsonencode(%[4]s)
  %[3]s
  %[5]s
}

resource "corral_environment" "e" {
  name = %[1]q
  %[3]s
}
`

// TestAgentAndEnvironment creates, updates (a new agent version), imports
// and destroys (archives the agent, deletes the environment) an agent and
// an environment of the provider's tenant, and plans again after changes
// made through the REST API behind Terraform's back.
func TestAgentAndEnvironment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	v1 := e.config(fmt.Sprintf(restConfig, "tf-one", "Be brief.", "", `[{ type = "agent_toolset_20260401" }]`, ""))
	v2tail := fmt.Sprintf(restConfig, "tf-two", "Be briefer.", `
  description = "made by terraform"
  metadata    = { team = "infra", tier = "gold" }`,
		`[{ type = "agent_toolset_20260401" }, { type = "mcp_toolset", mcp_server_name = "docs" }]`,
		`mcp_servers = jsonencode([{ type = "url", name = "docs", url = "https://mcp.example.com/sse" }])`)
	v2 := e.config(v2tail)
	var agentID, envID string
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: e.factories(),
		CheckDestroy: func(*terraform.State) error {
			var a agentJSON
			if err := e.c.rest(context.Background(), http.MethodGet, "/v1/agents/"+agentID, nil, &a); err != nil {
				return fmt.Errorf("after destroy, the agent: %v", err)
			}
			if a.ArchivedAt == nil {
				return fmt.Errorf("after destroy, agent %s is not archived", agentID)
			}
			if err := e.c.rest(context.Background(), http.MethodGet, "/v1/environments/"+envID, nil, nil); !notFound(err) {
				return fmt.Errorf("after destroy, environment %s: %v, want not found", envID, err)
			}
			return nil
		},
		Steps: []resource.TestStep{
			{
				Config: v1,
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_agent.a", "version", "1"),
					resource.TestCheckResourceAttr("corral_agent.a", "model", "claude-sonnet-4-5"),
					resource.TestCheckResourceAttr("corral_agent.a", "description", ""),
					resource.TestCheckResourceAttr("corral_agent.a", "metadata.%", "0"),
					// The configuration's text, not the API's resolved form.
					resource.TestCheckResourceAttr("corral_agent.a", "tools", `[{"type":"agent_toolset_20260401"}]`),
					resource.TestCheckResourceAttr("corral_agent.a", "mcp_servers", `[]`),
					resource.TestCheckResourceAttr("corral_environment.e", "networking", "limited"),
					resource.TestCheckResourceAttr("corral_environment.e", "allowed_hosts.#", "0"),
					resource.TestCheckNoResourceAttr("corral_environment.e", "description"),
					func(s *terraform.State) (err error) {
						if agentID, err = stateAttr(s, "corral_agent.a", "id"); err != nil {
							return err
						}
						envID, err = stateAttr(s, "corral_environment.e", "id")
						return err
					},
				),
			},
			{
				Config: v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_agent.a", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_environment.e", plancheck.ResourceActionUpdate),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_agent.a", "version", "2"),
					resource.TestCheckResourceAttr("corral_agent.a", "name", "tf-two"),
					resource.TestCheckResourceAttr("corral_agent.a", "metadata.tier", "gold"),
					resource.TestCheckResourceAttr("corral_environment.e", "description", "made by terraform"),
					resource.TestCheckResourceAttr("corral_environment.e", "metadata.%", "2"),
					func(*terraform.State) error {
						if id := agentID; id == "" {
							return fmt.Errorf("no agent id")
						}
						var a agentJSON
						if err := e.c.rest(context.Background(), http.MethodGet, "/v1/agents/"+agentID, nil, &a); err != nil {
							return err
						}
						if a.Version != 2 || a.System != "Be briefer." {
							return fmt.Errorf("the API has agent %s version %d with system %q, want version 2 with the new system", agentID, a.Version, a.System)
						}
						if !strings.Contains(string(a.Tools), `"mcp_server_name":"docs"`) || !strings.Contains(string(a.MCPServers), `"name":"docs"`) {
							return fmt.Errorf("the API has agent %s with tools %s and MCP servers %s, want the docs server and its toolset", agentID, a.Tools, a.MCPServers)
						}
						return nil
					},
				),
			},
			{
				ResourceName: "corral_agent.a", ImportState: true, ImportStateVerify: true,
				// An import holds the API's resolved JSON, not the
				// configuration's text (the next plan sends the latter).
				ImportStateVerifyIgnore: []string{"tools", "mcp_servers"},
			},
			{ResourceName: "corral_environment.e", ImportState: true, ImportStateVerify: true},
			{
				// Drift: the agent updated and a metadata key of the
				// environment removed through the API; the plan puts both
				// back (the agent in a third version).
				PreConfig: func() {
					ctx := context.Background()
					if err := e.c.rest(ctx, http.MethodPost, "/v1/agents/"+agentID, map[string]any{
						"version": 2, "system": "changed elsewhere",
						"tools": []any{map[string]any{"type": "mcp_toolset", "mcp_server_name": "docs"}},
					}, nil); err != nil {
						t.Fatal(err)
					}
					if err := e.c.rest(ctx, http.MethodPost, "/v1/environments/"+envID, map[string]any{"metadata": map[string]any{"tier": nil}}, nil); err != nil {
						t.Fatal(err)
					}
				},
				Config: v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_agent.a", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_environment.e", plancheck.ResourceActionUpdate),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_agent.a", "version", "4"),
					resource.TestCheckResourceAttr("corral_agent.a", "system", "Be briefer."),
					func(*terraform.State) error {
						var a agentJSON
						if err := e.c.rest(context.Background(), http.MethodGet, "/v1/agents/"+agentID, nil, &a); err != nil {
							return err
						}
						if !strings.Contains(string(a.Tools), "agent_toolset_20260401") {
							return fmt.Errorf("after the drift was applied away, agent %s has tools %s, want the agent toolset back", agentID, a.Tools)
						}
						return nil
					},
					resource.TestCheckResourceAttr("corral_environment.e", "metadata.tier", "gold"),
				),
			},
			{
				// An agent archived behind Terraform's back is planned anew.
				PreConfig: func() {
					if err := e.c.rest(context.Background(), http.MethodPost, "/v1/agents/"+agentID+"/archive", struct{}{}, nil); err != nil {
						t.Fatal(err)
					}
				},
				Config: v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_agent.a", plancheck.ResourceActionCreate),
				}},
				Check: func(s *terraform.State) (err error) {
					agentID, err = stateAttr(s, "corral_agent.a", "id")
					return err
				},
			},
			{
				// A limited network with its allowed hosts (the host's
				// egress proxy enforces them).
				Config: e.config(v2tail + `
resource "corral_environment" "net" {
  name          = "net"
  allowed_hosts = ["example.com", "*.example.org"]
}`),
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_environment.net", "allowed_hosts.#", "2"),
					resource.TestCheckResourceAttr("corral_environment.net", "allowed_hosts.1", "*.example.org"),
				),
			},
			{
				// The API refuses a network it cannot give (this server has
				// no package mirrors); its reason is the diagnostic.
				Config: e.config(v2tail + `
resource "corral_environment" "net" {
  name                   = "net"
  allowed_hosts          = ["example.com"]
  allow_package_managers = true
}`),
				ExpectError: regexp.MustCompile(`config\.networking\.allow_package_managers: this corral has no package\s+mirrors`),
			},
		},
	})
}
