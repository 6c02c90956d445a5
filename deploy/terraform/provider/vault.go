package provider

import (
	"context"
	"net/http"
	"net/url"

	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// vaultResource is corral_vault: a named set of credentials that sessions
// name in vault_ids. Destroy deletes it and its credentials.
type vaultResource struct{ c *client }

func newVaultResource() resource.Resource { return &vaultResource{} }

var (
	_ resource.ResourceWithConfigure   = (*vaultResource)(nil)
	_ resource.ResourceWithImportState = (*vaultResource)(nil)
)

type vaultModel struct {
	ID          types.String `tfsdk:"id"`
	DisplayName types.String `tfsdk:"display_name"`
	Metadata    types.Map    `tfsdk:"metadata"`
	CreatedAt   types.String `tfsdk:"created_at"`
}

type vaultJSON struct {
	ID          string            `json:"id"`
	DisplayName string            `json:"display_name"`
	Metadata    map[string]string `json:"metadata"`
	CreatedAt   string            `json:"created_at"`
	ArchivedAt  *string           `json:"archived_at"`
}

func (r *vaultResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_vault"
}

func (r *vaultResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "A vault of the provider's tenant (api_key). Destroy deletes it with its credentials.",
		Attributes: map[string]schema.Attribute{
			"id":           schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The vault's id. Import with it."},
			"display_name": schema.StringAttribute{Required: true, Description: "At most 255 characters."},
			"metadata":     metadataAttribute(),
			"created_at":   schema.StringAttribute{Computed: true, PlanModifiers: keep},
		},
	}
}

func (r *vaultResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func setVault(m *vaultModel, v vaultJSON) {
	m.ID = types.StringValue(v.ID)
	m.DisplayName = types.StringValue(v.DisplayName)
	m.Metadata = mapOf(v.Metadata)
	m.CreatedAt = types.StringValue(v.CreatedAt)
}

func (r *vaultResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m vaultModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	md := stringMap(ctx, m.Metadata, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	var out vaultJSON
	if err := r.c.rest(ctx, http.MethodPost, "/v1/vaults", map[string]any{"display_name": m.DisplayName.ValueString(), "metadata": md}, &out); err != nil {
		apiError(&resp.Diagnostics, "Creating a vault", err)
		return
	}
	setVault(&m, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *vaultResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m vaultModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var out vaultJSON
	err := r.c.rest(ctx, http.MethodGet, "/v1/vaults/"+url.PathEscape(m.ID.ValueString()), nil, &out)
	if notFound(err) || (err == nil && out.ArchivedAt != nil) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading vault "+m.ID.ValueString(), err)
		return
	}
	setVault(&m, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *vaultResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state vaultModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	md := metadataPatch(ctx, state.Metadata, plan.Metadata, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	var out vaultJSON
	err := r.c.rest(ctx, http.MethodPost, "/v1/vaults/"+url.PathEscape(state.ID.ValueString()),
		map[string]any{"display_name": plan.DisplayName.ValueString(), "metadata": md}, &out)
	if err != nil {
		apiError(&resp.Diagnostics, "Updating vault "+state.ID.ValueString(), err)
		return
	}
	setVault(&plan, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *vaultResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m vaultModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	err := r.c.rest(ctx, http.MethodDelete, "/v1/vaults/"+url.PathEscape(m.ID.ValueString()), nil, nil)
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Deleting vault "+m.ID.ValueString(), err)
	}
}

func (r *vaultResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}
