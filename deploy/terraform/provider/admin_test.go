package provider

import (
	"context"
	"fmt"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

const adminConfig = `
resource "corral_tenant" "t" {
  id        = "tenant_tf"
  name      = "Terraform"
  suspended = %[1]t
}

resource "corral_principal" "bot" {
  tenant_id = corral_tenant.t.id
  name      = "bot"
  roles     = %[2]s
  disabled  = %[1]t
}

resource "corral_principal" "off" {
  tenant_id = corral_tenant.t.id
  name      = "off"
  disabled  = true
}

resource "corral_api_key" "bot" {
  tenant_id    = corral_tenant.t.id
  name         = "bot-key"
  principal_id = corral_principal.bot.id
}

resource "corral_api_key" "solo" {
  tenant_id = corral_tenant.t.id
  name      = "solo"
}

resource "corral_tenant_quota" "q" {
  tenant_id           = corral_tenant.t.id
  concurrent_sessions = %[3]d
  %[4]s
}
`

// TestAdminResources creates, updates, imports and destroys a tenant, a
// principal, two API keys and a quota, and plans again after changes made
// through the admin API behind Terraform's back.
func TestAdminResources(t *testing.T) {
	t.Parallel()
	e := setup(t)
	v1 := e.config(fmt.Sprintf(adminConfig, false, `["developer"]`, 5, ""))
	v2 := e.config(fmt.Sprintf(adminConfig, true, `["developer", "viewer"]`, 7, "memory_mib = 4096"))
	// v3 keeps only the tenant and the solo key: the principal, its key
	// and the quota are destroyed.
	v3 := e.config(`
resource "corral_tenant" "t" {
  id        = "tenant_tf"
  name      = "Terraform"
  suspended = true
}

resource "corral_api_key" "solo" {
  tenant_id = corral_tenant.t.id
  name      = "solo"
}
`)
	var soloID, botID, botKeyID string
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: e.factories(),
		CheckDestroy: func(*terraform.State) error {
			_, err := adminCall(context.Background(), e.c, func(ctx context.Context) (*adminv1.GetTenantResponse, error) {
				return e.c.tenants().GetTenant(ctx, &adminv1.GetTenantRequest{TenantId: "tenant_tf"})
			})
			if !notFound(err) {
				return fmt.Errorf("after destroy, GetTenant tenant_tf: %v, want not found", err)
			}
			return nil
		},
		Steps: []resource.TestStep{
			{
				Config: v1,
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_tenant.t", "status", "active"),
					resource.TestCheckResourceAttrSet("corral_tenant.t", "created_at"),
					resource.TestCheckResourceAttr("corral_principal.bot", "kind", "service"),
					resource.TestCheckResourceAttr("corral_principal.bot", "roles.#", "1"),
					resource.TestCheckResourceAttr("corral_principal.off", "disabled", "true"),
					resource.TestCheckResourceAttr("corral_principal.off", "roles.#", "0"),
					resource.TestCheckResourceAttrPair("corral_api_key.bot", "principal_id", "corral_principal.bot", "id"),
					resource.TestCheckResourceAttr("corral_api_key.bot", "roles.#", "1"),
					resource.TestCheckTypeSetElemAttr("corral_api_key.bot", "roles.*", "developer"),
					resource.TestCheckTypeSetElemAttr("corral_api_key.solo", "roles.*", "admin"),
					resource.TestCheckResourceAttr("corral_api_key.solo", "principal", "service:solo"),
					keyWorks(e, "corral_api_key.solo"),
					resource.TestCheckResourceAttr("corral_tenant_quota.q", "concurrent_sessions", "5"),
					resource.TestCheckResourceAttr("corral_tenant_quota.q", "effective.concurrent_sessions", "5"),
					resource.TestCheckNoResourceAttr("corral_tenant_quota.q", "memory_mib"),
					resource.TestCheckResourceAttrSet("corral_tenant_quota.q", "effective.memory_mib"),
					func(s *terraform.State) (err error) {
						if botID, err = stateAttr(s, "corral_principal.bot", "id"); err != nil {
							return err
						}
						if botKeyID, err = stateAttr(s, "corral_api_key.bot", "id"); err != nil {
							return err
						}
						soloID, err = stateAttr(s, "corral_api_key.solo", "id")
						return err
					},
				),
			},
			{
				Config: v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_tenant.t", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_principal.bot", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_api_key.bot", plancheck.ResourceActionNoop),
					plancheck.ExpectResourceAction("corral_tenant_quota.q", plancheck.ResourceActionUpdate),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_tenant.t", "status", "suspended"),
					resource.TestCheckResourceAttr("corral_principal.bot", "disabled", "true"),
					resource.TestCheckResourceAttr("corral_principal.bot", "roles.#", "2"),
					resource.TestCheckResourceAttr("corral_tenant_quota.q", "effective.concurrent_sessions", "7"),
					resource.TestCheckResourceAttr("corral_tenant_quota.q", "memory_mib", "4096"),
					resource.TestCheckResourceAttr("corral_tenant_quota.q", "effective.memory_mib", "4096"),
				),
			},
			{
				// A key bound to a principal carries the principal's roles,
				// which changed in place: a refresh reads them.
				RefreshState: true,
				Check:        resource.TestCheckResourceAttr("corral_api_key.bot", "roles.#", "2"),
			},
			{ResourceName: "corral_tenant.t", ImportState: true, ImportStateVerify: true},
			{ResourceName: "corral_principal.bot", ImportState: true, ImportStateVerify: true, ImportStateIdFunc: pairID("corral_principal.bot", "tenant_id")},
			{
				ResourceName: "corral_api_key.bot", ImportState: true, ImportStateVerify: true,
				ImportStateIdFunc: pairID("corral_api_key.bot", "tenant_id"),
				// The API shows a secret once: an imported key has none.
				ImportStateVerifyIgnore: []string{"secret"},
			},
			{ResourceName: "corral_tenant_quota.q", ImportState: true, ImportStateVerify: true},
			{
				// Drift: the tenant resumed, the principal's roles replaced,
				// the quota changed and a key revoked, all through the API.
				PreConfig: func() {
					admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (any, error) {
						return c.ResumeTenant(ctx, &adminv1.ResumeTenantRequest{TenantId: "tenant_tf"})
					})
					n := int32(9)
					admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (any, error) {
						return c.SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: "tenant_tf", Overrides: &adminv1.QuotaOverride{ConcurrentSessions: &n}})
					})
					admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (any, error) {
						return c.RevokeAPIKey(ctx, &adminv1.RevokeAPIKeyRequest{TenantId: "tenant_tf", KeyId: soloID})
					})
					admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (any, error) {
						return c.SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{TenantId: "tenant_tf", PrincipalId: botID, Roles: []string{"viewer"}})
					})
				},
				Config: v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("corral_tenant.t", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_tenant_quota.q", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_principal.bot", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("corral_api_key.solo", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("corral_api_key.bot", plancheck.ResourceActionNoop),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("corral_tenant.t", "status", "suspended"),
					resource.TestCheckResourceAttr("corral_tenant_quota.q", "concurrent_sessions", "7"),
					resource.TestCheckResourceAttr("corral_principal.bot", "roles.#", "2"),
				),
			},
			{
				// Destroy of a principal disables it and removes its roles;
				// of a key, revokes it; of a quota, removes the overrides.
				Config: v3,
				Check: func(*terraform.State) error {
					p := admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (*adminv1.GetPrincipalResponse, error) {
						return c.GetPrincipal(ctx, &adminv1.GetPrincipalRequest{TenantId: "tenant_tf", PrincipalId: botID})
					}).GetPrincipal()
					if p.GetDisabledAt() == nil || len(p.GetRoles()) > 0 {
						return fmt.Errorf("destroyed principal %s: disabled_at %v, roles %v; want disabled with no roles", botID, p.GetDisabledAt(), p.GetRoles())
					}
					keys := admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (*adminv1.ListAPIKeysResponse, error) {
						return c.ListAPIKeys(ctx, &adminv1.ListAPIKeysRequest{TenantId: "tenant_tf", PrincipalId: botID})
					}).GetApiKeys()
					if len(keys) != 1 || keys[0].GetId() != botKeyID || keys[0].GetRevokedAt() == nil {
						return fmt.Errorf("destroyed key %s: the principal's keys are %v, want it revoked", botKeyID, keys)
					}
					q := admin(t, e, func(ctx context.Context, c adminv1.TenantsServiceClient) (*adminv1.GetQuotaResponse, error) {
						return c.GetQuota(ctx, &adminv1.GetQuotaRequest{TenantId: "tenant_tf"})
					})
					if o := q.GetOverrides(); o.ConcurrentSessions != nil || o.MemoryMib != nil {
						return fmt.Errorf("destroyed quota: overrides %v remain", o)
					}
					return nil
				},
			},
		},
	})
}

// pairID is the import id <attr>/<id> of the resource name in the state.
func pairID(name, first string) resource.ImportStateIdFunc {
	return func(s *terraform.State) (string, error) {
		a, err := stateAttr(s, name, first)
		if err != nil {
			return "", err
		}
		id, err := stateAttr(s, name, "id")
		return a + "/" + id, err
	}
}
