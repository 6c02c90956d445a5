package provider

import (
	"context"
	"net/http"
	"net/url"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/booldefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/listdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// environmentResource is corral_environment: a cloud environment of the
// provider's tenant, with its networking. The API refuses what a sandbox
// would not get (today any network at all), and the provider passes its
// refusal on as the diagnostic. Destroy deletes the environment.
type environmentResource struct{ c *client }

func newEnvironmentResource() resource.Resource { return &environmentResource{} }

var (
	_ resource.ResourceWithConfigure   = (*environmentResource)(nil)
	_ resource.ResourceWithImportState = (*environmentResource)(nil)
)

type environmentModel struct {
	ID                   types.String `tfsdk:"id"`
	Name                 types.String `tfsdk:"name"`
	Description          types.String `tfsdk:"description"`
	Metadata             types.Map    `tfsdk:"metadata"`
	Networking           types.String `tfsdk:"networking"`
	AllowedHosts         types.List   `tfsdk:"allowed_hosts"`
	AllowPackageManagers types.Bool   `tfsdk:"allow_package_managers"`
	AllowMCPServers      types.Bool   `tfsdk:"allow_mcp_servers"`
	CreatedAt            types.String `tfsdk:"created_at"`
}

type environmentJSON struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
	Config      struct {
		Networking struct {
			Type                 string   `json:"type"`
			AllowedHosts         []string `json:"allowed_hosts"`
			AllowPackageManagers bool     `json:"allow_package_managers"`
			AllowMCPServers      bool     `json:"allow_mcp_servers"`
		} `json:"networking"`
	} `json:"config"`
	CreatedAt  string  `json:"created_at"`
	ArchivedAt *string `json:"archived_at"`
}

func (r *environmentResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_environment"
}

func (r *environmentResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "A cloud environment of the provider's tenant (api_key): what its sessions' sandboxes may reach. Destroy deletes it.",
		Attributes: map[string]schema.Attribute{
			"id":          schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The environment's id (env_...). Import with it."},
			"name":        schema.StringAttribute{Required: true},
			"description": schema.StringAttribute{Optional: true},
			"metadata":    metadataAttribute(),
			"networking": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString("limited"),
				Description: `"limited" (the default: only allowed_hosts) or "unrestricted" (any public name, through the host's egress proxy, which still refuses private addresses and audits every connection). corral refuses "unrestricted" unless the tenant's policy grants it (quotas.yaml unrestricted_networking).`,
			},
			"allowed_hosts": schema.ListAttribute{
				ElementType: types.StringType, Optional: true, Computed: true,
				Default:     listdefault.StaticValue(types.ListValueMust(types.StringType, []attr.Value{})),
				Description: "Hosts a limited environment's sandboxes may reach.",
			},
			"allow_package_managers": schema.BoolAttribute{Optional: true, Computed: true, Default: booldefault.StaticBool(false)},
			"allow_mcp_servers":      schema.BoolAttribute{Optional: true, Computed: true, Default: booldefault.StaticBool(false)},
			"created_at":             schema.StringAttribute{Computed: true, PlanModifiers: keep},
		},
	}
}

func (r *environmentResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

// config is the config member the plan asks for.
func (m *environmentModel) config(ctx context.Context, diags *diag.Diagnostics) map[string]any {
	n := map[string]any{"type": m.Networking.ValueString()}
	if m.Networking.ValueString() == "limited" {
		var hosts []string
		if !m.AllowedHosts.IsNull() && !m.AllowedHosts.IsUnknown() {
			diags.Append(m.AllowedHosts.ElementsAs(ctx, &hosts, false)...)
		}
		if hosts == nil {
			hosts = []string{}
		}
		n["allowed_hosts"] = hosts
		n["allow_package_managers"] = m.AllowPackageManagers.ValueBool()
		n["allow_mcp_servers"] = m.AllowMCPServers.ValueBool()
	}
	return map[string]any{"type": "cloud", "networking": n}
}

func (r *environmentResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m environmentModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	md := stringMap(ctx, m.Metadata, &resp.Diagnostics)
	cfg := m.config(ctx, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	body := map[string]any{"name": m.Name.ValueString(), "config": cfg, "metadata": md}
	if !m.Description.IsNull() {
		body["description"] = m.Description.ValueString()
	}
	var out environmentJSON
	if err := r.c.rest(ctx, http.MethodPost, "/v1/environments", body, &out); err != nil {
		apiError(&resp.Diagnostics, "Creating an environment", err)
		return
	}
	setEnvironment(&m, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func setEnvironment(m *environmentModel, e environmentJSON) {
	m.ID = types.StringValue(e.ID)
	m.Name = types.StringValue(e.Name)
	m.Description = types.StringPointerValue(e.Description)
	m.Metadata = mapOf(e.Metadata)
	n := e.Config.Networking
	m.Networking = types.StringValue(n.Type)
	hosts := make([]attr.Value, len(n.AllowedHosts))
	for i, h := range n.AllowedHosts {
		hosts[i] = types.StringValue(h)
	}
	m.AllowedHosts = types.ListValueMust(types.StringType, hosts)
	m.AllowPackageManagers = types.BoolValue(n.AllowPackageManagers)
	m.AllowMCPServers = types.BoolValue(n.AllowMCPServers)
	m.CreatedAt = types.StringValue(e.CreatedAt)
}

func (r *environmentResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m environmentModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var out environmentJSON
	err := r.c.rest(ctx, http.MethodGet, "/v1/environments/"+url.PathEscape(m.ID.ValueString()), nil, &out)
	if notFound(err) || (err == nil && out.ArchivedAt != nil) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading environment "+m.ID.ValueString(), err)
		return
	}
	setEnvironment(&m, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *environmentResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state environmentModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	md := metadataPatch(ctx, state.Metadata, plan.Metadata, &resp.Diagnostics)
	cfg := plan.config(ctx, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	body := map[string]any{"name": plan.Name.ValueString(), "config": cfg, "metadata": md, "description": nil}
	if !plan.Description.IsNull() {
		body["description"] = plan.Description.ValueString()
	}
	var out environmentJSON
	if err := r.c.rest(ctx, http.MethodPost, "/v1/environments/"+url.PathEscape(state.ID.ValueString()), body, &out); err != nil {
		apiError(&resp.Diagnostics, "Updating environment "+state.ID.ValueString(), err)
		return
	}
	setEnvironment(&plan, out)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *environmentResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m environmentModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	err := r.c.rest(ctx, http.MethodDelete, "/v1/environments/"+url.PathEscape(m.ID.ValueString()), nil, nil)
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Deleting environment "+m.ID.ValueString(), err)
	}
}

func (r *environmentResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}
