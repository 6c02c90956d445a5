package provider

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
)

const vaultConfig = `
resource "corral_vault" "v" {
  display_name = %[1]q
  %[2]s
}

resource "corral_vault_credential" "c" {
  vault_id         = corral_vault.v.id
  display_name     = %[1]q
  mcp_server_url   = %[5]q
  token_wo         = %[3]q
  token_wo_version = %[4]d
}
`

// TestVaultAndCredential creates, updates, imports and destroys a vault
// and a static_bearer credential whose token is a write-only argument,
// rotated by raising token_wo_version.
func TestVaultAndCredential(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := func(name, extra, token string, version int) string {
		return e.config(fmt.Sprintf(vaultConfig, name, extra, token, version, "https://mcp.example.com/sse"))
	}
	var vaultID, credID, oauthID string
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: e.factories(),
		CheckDestroy: func(*terraform.State) error {
			if err := e.c.rest(context.Background(), http.MethodGet, "/v1/vaults/"+vaultID, nil, nil); !notFound(err) {
				return fmt.Errorf("after destroy, vault %s: %v, want not found", vaultID, err)
			}
			return nil
		},
		Steps: []resource.TestStep{
			{
				Config: cfg("tf-vault", "", "tok-one", 1),
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_vault.v", "display_name", "tf-vault"),
					resource.TestCheckResourceAttr("corral_vault_credential.c", "mcp_server_url", "https://mcp.example.com/sse"),
					// Write-only: never in the state.
					resource.TestCheckNoResourceAttr("corral_vault_credential.c", "token_wo"),
					func(s *terraform.State) (err error) {
						if vaultID, err = stateAttr(s, "corral_vault.v", "id"); err != nil {
							return err
						}
						credID, err = stateAttr(s, "corral_vault_credential.c", "id")
						return err
					},
				),
			},
			{
				// A new token under the same version is not sent: Terraform
				// cannot see a write-only value change. The plan is empty.
				Config:   cfg("tf-vault", "", "tok-unsent", 1),
				PlanOnly: true,
			},
			{
				// Raising the version sends the token: a token the API
				// refuses shows that it was sent, and the API's reason
				// (which never repeats the token) is the diagnostic.
				Config:      cfg("tf-vault", "", "bad token", 2),
				ExpectError: regexp.MustCompile(`auth\.token: character 4 is not a visible ASCII character`),
			},
			{
				Config: cfg("tf-vault-2", `metadata = { owner = "infra" }`, "tok-two", 2),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_vault.v", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_vault_credential.c", plancheck.ResourceActionUpdate),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_vault.v", "display_name", "tf-vault-2"),
					resource.TestCheckResourceAttr("corral_vault.v", "metadata.owner", "infra"),
					resource.TestCheckResourceAttr("corral_vault_credential.c", "display_name", "tf-vault-2"),
					resource.TestCheckResourceAttr("corral_vault_credential.c", "token_wo_version", "2"),
				),
			},
			{ResourceName: "corral_vault.v", ImportState: true, ImportStateVerify: true},
			{
				ResourceName: "corral_vault_credential.c", ImportState: true, ImportStateVerify: true,
				ImportStateIdFunc: pairID("corral_vault_credential.c", "vault_id"),
				// Terraform's own counter, not the API's: an import has none.
				ImportStateVerifyIgnore: []string{"token_wo_version"},
			},
			{
				// Drift: the credential renamed and the vault's metadata
				// cleared through the API.
				PreConfig: func() {
					ctx := context.Background()
					if err := e.c.rest(ctx, http.MethodPost, "/v1/vaults/"+vaultID+"/credentials/"+credID, map[string]any{"display_name": "elsewhere"}, nil); err != nil {
						t.Fatal(err)
					}
					if err := e.c.rest(ctx, http.MethodPost, "/v1/vaults/"+vaultID, map[string]any{"metadata": map[string]any{"owner": nil}}, nil); err != nil {
						t.Fatal(err)
					}
				},
				Config: cfg("tf-vault-2", `metadata = { owner = "infra" }`, "tok-two", 2),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_vault.v", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_vault_credential.c", plancheck.ResourceActionUpdate),
				}},
			},
			{
				// A new server URL replaces the credential.
				Config: e.config(fmt.Sprintf(vaultConfig, "tf-vault-2", `metadata = { owner = "infra" }`, "tok-two", 2, "https://mcp2.example.com/sse")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_vault.v", plancheck.ResourceActionNoop),
					plancheck.ExpectResourceAction("corral_vault_credential.c", plancheck.ResourceActionDestroyBeforeCreate),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_vault_credential.c", "mcp_server_url", "https://mcp2.example.com/sse"),
					func(*terraform.State) error {
						// The replaced credential is deleted.
						if err := e.c.rest(context.Background(), http.MethodGet, "/v1/vaults/"+vaultID+"/credentials/"+credID, nil, nil); !notFound(err) {
							return fmt.Errorf("replaced credential %s: %v, want not found", credID, err)
						}
						return nil
					},
				),
			},
			{
				// An mcp_oauth credential made through the API is not
				// taken for a bearer token: importing it is refused.
				PreConfig: func() {
					var out struct{ ID string }
					if err := e.c.rest(context.Background(), http.MethodPost, "/v1/vaults/"+vaultID+"/credentials", map[string]any{
						"auth": map[string]any{"type": "mcp_oauth", "mcp_server_url": "https://oauth.example.com/mcp", "access_token": "at-1"},
					}, &out); err != nil {
						t.Fatal(err)
					}
					oauthID = out.ID
				},
				ResourceName: "corral_vault_credential.c", ImportState: true,
				ImportStateIdFunc: func(*terraform.State) (string, error) { return vaultID + "/" + oauthID, nil },
				ExpectError:       regexp.MustCompile(`manages static_bearer credentials;\s+\S+ is mcp_oauth`),
			},
		},
	})
}
