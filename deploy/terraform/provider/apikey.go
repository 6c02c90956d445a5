package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/setplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// apiKeyResource is corral_api_key. The API shows a key's secret once, in
// CreateAPIKey's answer: the state keeps it (sensitive) from then on, and
// any change is a new key (rotation is replacement; destroy revokes).
type apiKeyResource struct{ c *client }

func newAPIKeyResource() resource.Resource { return &apiKeyResource{} }

var (
	_ resource.ResourceWithConfigure   = (*apiKeyResource)(nil)
	_ resource.ResourceWithImportState = (*apiKeyResource)(nil)
)

type apiKeyModel struct {
	ID          types.String `tfsdk:"id"`
	TenantID    types.String `tfsdk:"tenant_id"`
	Name        types.String `tfsdk:"name"`
	Roles       types.Set    `tfsdk:"roles"`
	PrincipalID types.String `tfsdk:"principal_id"`
	Principal   types.String `tfsdk:"principal"`
	Prefix      types.String `tfsdk:"prefix"`
	Secret      types.String `tfsdk:"secret"`
	CreatedAt   types.String `tfsdk:"created_at"`
}

func (r *apiKeyResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_api_key"
}

func (r *apiKeyResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "A tenant's API key. Any change replaces the key (a new secret); destroy revokes it.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "The key's id. Import with <tenant_id>/<id> (the secret is not imported: the API shows it once).",
			},
			"tenant_id": schema.StringAttribute{Required: true, PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()}},
			"name":      schema.StringAttribute{Required: true, PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()}},
			"roles": schema.SetAttribute{
				ElementType: types.StringType, Optional: true, Computed: true,
				PlanModifiers: []planmodifier.Set{setplanmodifier.RequiresReplace(), setplanmodifier.UseStateForUnknown()},
				Description:   `Roles of the new service principal named after the key (default ["admin"]). Must be unset with principal_id; the key then carries that principal's roles.`,
			},
			"principal_id": schema.StringAttribute{
				Optional: true, Computed: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace(), stringplanmodifier.UseStateForUnknown()},
				Description:   "The service principal the key acts as (e.g. corral_principal.x.id); unset: a new one named after the key.",
			},
			"principal": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: `The principal as the audit log names it ("service:<name>").`,
			},
			"prefix": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "The secret's first characters, to match a leaked key to this record.",
			},
			"secret": schema.StringAttribute{
				Computed: true, Sensitive: true, PlanModifiers: keep,
				Description: "The key itself, as the API returned it once. Null after import.",
			},
			"created_at": schema.StringAttribute{Computed: true, PlanModifiers: keep},
		},
	}
}

func (r *apiKeyResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (r *apiKeyResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m apiKeyModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	roles := stringSet(ctx, m.Roles, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	tid := m.TenantID.ValueString()
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.CreateAPIKeyResponse, error) {
		return r.c.tenants().CreateAPIKey(ctx, &adminv1.CreateAPIKeyRequest{
			TenantId: tid, Name: m.Name.ValueString(), Roles: roles, PrincipalId: m.PrincipalID.ValueString(),
		})
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Creating API key "+m.Name.ValueString()+" in "+tid, err)
		return
	}
	setAPIKey(&m, out.GetApiKey())
	m.Secret = types.StringValue(out.GetSecret())
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func setAPIKey(m *apiKeyModel, k *adminv1.APIKey) {
	m.ID = types.StringValue(k.GetId())
	m.TenantID = types.StringValue(k.GetTenantId())
	m.Name = types.StringValue(k.GetName())
	m.Roles = setOf(k.GetRoles())
	m.PrincipalID = types.StringValue(k.GetPrincipalId())
	m.Principal = types.StringValue(k.GetPrincipal())
	m.Prefix = types.StringValue(k.GetPrefix())
	m.CreatedAt = timestamp(k.GetCreatedAt())
}

func (r *apiKeyResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m apiKeyModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// The API lists keys (without secrets) but gets none by id; the
	// principal's keys are few.
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.ListAPIKeysResponse, error) {
		return r.c.tenants().ListAPIKeys(ctx, &adminv1.ListAPIKeysRequest{TenantId: m.TenantID.ValueString(), PrincipalId: m.PrincipalID.ValueString()})
	})
	if notFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading API key "+m.ID.ValueString(), err)
		return
	}
	for _, k := range out.GetApiKeys() {
		if k.GetId() != m.ID.ValueString() {
			continue
		}
		if k.GetRevokedAt() != nil {
			break // revoked behind Terraform's back: a new key is planned
		}
		setAPIKey(&m, k)
		resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
		return
	}
	resp.State.RemoveResource(ctx)
}

// Update is never called: every attribute replaces the key.
func (r *apiKeyResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	resp.Diagnostics.AddError("corral_api_key cannot change in place", "every change to an API key replaces it; this is a bug in the provider")
}

func (r *apiKeyResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m apiKeyModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	_, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.RevokeAPIKeyResponse, error) {
		return r.c.tenants().RevokeAPIKey(ctx, &adminv1.RevokeAPIKeyRequest{TenantId: m.TenantID.ValueString(), KeyId: m.ID.ValueString()})
	})
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Revoking API key "+m.ID.ValueString(), err)
	}
}

func (r *apiKeyResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importPair(ctx, req, resp, "tenant_id", "id")
}
