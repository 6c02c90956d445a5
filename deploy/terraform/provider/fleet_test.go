package provider

import (
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-testing/echoprovider"
	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/tfversion"

	"corral.dev/corral/test/processhost"
)

// TestDataSourcesAndJoinToken reads the cluster, the hosts and a tenant,
// and opens the ephemeral join token, whose value reaches the state only
// through the echo provider (terraform-plugin-testing's way to look at an
// ephemeral value).
func TestDataSourcesAndJoinToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	processhost.Start(t, e.srv, "tf-host", nil)
	factories := e.factories()
	factories["echo"] = echoprovider.NewProviderServer()
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: map[string]func() (tfprotov6.ProviderServer, error)(factories),
		TerraformVersionChecks:   []tfversion.TerraformVersionCheck{tfversion.SkipBelow(tfversion.Version1_10_0)},
		Steps: []resource.TestStep{
			{
				Config: e.config(`
data "corral_cluster" "c" {}
data "corral_hosts" "all" {}
data "corral_tenant" "d" { id = "tenant_default" }

ephemeral "corral_host_join_token" "j" { ttl = "30m" }

provider "echo" { data = ephemeral.corral_host_join_token.j }
resource "echo" "j" {}
`),
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("data.corral_cluster.c", "node_id", "tf-test"),
					resource.TestCheckResourceAttr("data.corral_cluster.c", "raft_state", "Leader"),
					resource.TestCheckResourceAttr("data.corral_cluster.c", "leader_id", "tf-test"),
					resource.TestCheckResourceAttr("data.corral_cluster.c", "database_reachable", "true"),
					resource.TestCheckResourceAttr("data.corral_cluster.c", "members.#", "1"),
					resource.TestCheckResourceAttr("data.corral_cluster.c", "members.0.leader", "true"),
					resource.TestCheckResourceAttr("data.corral_hosts.all", "hosts.#", "1"),
					resource.TestCheckResourceAttr("data.corral_hosts.all", "hosts.0.id", "tf-host"),
					resource.TestCheckResourceAttr("data.corral_hosts.all", "hosts.0.runtimes.0", "process"),
					resource.TestCheckResourceAttr("data.corral_tenant.d", "status", "active"),
					resource.TestCheckResourceAttrSet("data.corral_tenant.d", "name"),
					resource.TestMatchResourceAttr("echo.j", "data.token", regexp.MustCompile(`^corral1\.[^.]+\.[^.]+$`)),
					resource.TestCheckResourceAttrSet("echo.j", "data.ca_pin"),
				),
			},
		},
	})
}
