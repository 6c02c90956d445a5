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

// credentialResource is corral_vault_credential: a static_bearer
// credential, the token the control plane's MCP client sends to one MCP
// server for sessions that name the vault.
//
// The token is a write-only argument (Terraform 1.11 and later): it goes
// to the API and never into the plan or the state, and the API never shows
// it again. Terraform therefore cannot see it change: token_wo_version
// does. Raise it and the next apply sends token_wo again (rotation in
// place). The server URL cannot change after creation: a new one replaces
// the credential. Destroy deletes it.
type credentialResource struct{ c *client }

func newCredentialResource() resource.Resource { return &credentialResource{} }

var (
	_ resource.ResourceWithConfigure   = (*credentialResource)(nil)
	_ resource.ResourceWithImportState = (*credentialResource)(nil)
)

type credentialModel struct {
	ID             types.String `tfsdk:"id"`
	VaultID        types.String `tfsdk:"vault_id"`
	DisplayName    types.String `tfsdk:"display_name"`
	Metadata       types.Map    `tfsdk:"metadata"`
	MCPServerURL   types.String `tfsdk:"mcp_server_url"`
	TokenWO        types.String `tfsdk:"token_wo"`
	TokenWOVersion types.Int64  `tfsdk:"token_wo_version"`
	CreatedAt      types.String `tfsdk:"created_at"`
}

type credentialJSON struct {
	ID          string            `json:"id"`
	VaultID     string            `json:"vault_id"`
	DisplayName *string           `json:"display_name"`
	Metadata    map[string]string `json:"metadata"`
	Auth        struct {
		Type         string `json:"type"`
		MCPServerURL string `json:"mcp_server_url"`
	} `json:"auth"`
	CreatedAt  string  `json:"created_at"`
	ArchivedAt *string `json:"archived_at"`
}

func (r *credentialResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_vault_credential"
}

func (r *credentialResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		Description: "A static_bearer credential in a vault: the bearer token sent to one MCP server. Needs Terraform 1.11 or later (write-only token).",
		Attributes: map[string]schema.Attribute{
			"id":           schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The credential's id. Import with <vault_id>/<id>."},
			"vault_id":     schema.StringAttribute{Required: true, PlanModifiers: replace},
			"display_name": schema.StringAttribute{Optional: true, Description: "At most 255 characters."},
			"metadata":     metadataAttribute(),
			"mcp_server_url": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "The MCP server the token is for (http or https). A change replaces the credential.",
			},
			"token_wo": schema.StringAttribute{
				Required: true, Sensitive: true, WriteOnly: true,
				Description: "The bearer token (write-only: never in the plan or state). Sent on create and whenever token_wo_version changes.",
			},
			"token_wo_version": schema.Int64Attribute{
				Optional:    true,
				Description: "Raise it to send token_wo again (rotation).",
			},
			"created_at": schema.StringAttribute{Computed: true, PlanModifiers: keep},
		},
	}
}

func (r *credentialResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (m *credentialModel) path() string {
	return "/v1/vaults/" + url.PathEscape(m.VaultID.ValueString()) + "/credentials/" + url.PathEscape(m.ID.ValueString())
}

func setCredential(m *credentialModel, c credentialJSON) {
	m.ID = types.StringValue(c.ID)
	m.VaultID = types.StringValue(c.VaultID)
	m.DisplayName = types.StringPointerValue(c.DisplayName)
	m.Metadata = mapOf(c.Metadata)
	m.MCPServerURL = types.StringValue(c.Auth.MCPServerURL)
	m.TokenWO = types.StringNull()
	m.CreatedAt = types.StringValue(c.CreatedAt)
}

func (r *credentialResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m credentialModel
	var token types.String
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	resp.Diagnostics.Append(req.Config.GetAttribute(ctx, path.Root("token_wo"), &token)...)
	md := stringMap(ctx, m.Metadata, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	body := map[string]any{
		"auth":     map[string]any{"type": "static_bearer", "mcp_server_url": m.MCPServerURL.ValueString(), "token": token.ValueString()},
		"metadata": md,
	}
	if !m.DisplayName.IsNull() {
		body["display_name"] = m.DisplayName.ValueString()
	}
	var out credentialJSON
	if err := r.c.rest(ctx, http.MethodPost, "/v1/vaults/"+url.PathEscape(m.VaultID.ValueString())+"/credentials", body, &out); err != nil {
		apiError(&resp.Diagnostics, "Creating a credential in vault "+m.VaultID.ValueString(), err)
		return
	}
	setCredential(&m, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *credentialResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m credentialModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var out credentialJSON
	err := r.c.rest(ctx, http.MethodGet, m.path(), nil, &out)
	if notFound(err) || (err == nil && out.ArchivedAt != nil) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading credential "+m.ID.ValueString(), err)
		return
	}
	if out.Auth.Type != "static_bearer" {
		// An mcp_oauth credential (made through the API) has secrets and
		// fields this resource does not model: say so rather than manage
		// it as a bearer token.
		resp.Diagnostics.AddError("Unsupported credential type",
			"corral_vault_credential manages static_bearer credentials; "+m.ID.ValueString()+" is "+out.Auth.Type+". Manage it through the API.")
		return
	}
	setCredential(&m, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *credentialResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state credentialModel
	var token types.String
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	resp.Diagnostics.Append(req.Config.GetAttribute(ctx, path.Root("token_wo"), &token)...)
	md := metadataPatch(ctx, state.Metadata, plan.Metadata, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	body := map[string]any{"metadata": md, "display_name": nil}
	if !plan.DisplayName.IsNull() {
		body["display_name"] = plan.DisplayName.ValueString()
	}
	if !plan.TokenWOVersion.Equal(state.TokenWOVersion) {
		body["auth"] = map[string]any{"type": "static_bearer", "token": token.ValueString()}
	}
	var out credentialJSON
	if err := r.c.rest(ctx, http.MethodPost, state.path(), body, &out); err != nil {
		apiError(&resp.Diagnostics, "Updating credential "+state.ID.ValueString(), err)
		return
	}
	setCredential(&plan, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *credentialResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m credentialModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := r.c.rest(ctx, http.MethodDelete, m.path(), nil, nil); err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Deleting credential "+m.ID.ValueString(), err)
	}
}

func (r *credentialResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importPair(ctx, req, resp, "vault_id", "id")
}
