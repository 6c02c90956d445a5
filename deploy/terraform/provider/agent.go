package provider

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/mapdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// agentResource is corral_agent, over the public REST API with the
// provider's tenant key. Every update makes a new version of the agent
// (the API's versions are immutable), sent with the version it replaces
// so that a change made elsewhere meanwhile is a conflict, not lost;
// destroy archives the agent (the API deletes none: sessions refer to its
// versions).
//
// It manages an agent's name, model, system prompt, description and
// metadata, and its tools and MCP servers as JSON text (jsonencode). The
// API resolves tools with defaults (a toolset's default_config, its
// configs), so what it answers is not what was sent: the state keeps the
// configuration's text, and the private state the API's resolved form at
// the last apply. A read that finds the resolved form changed (behind
// Terraform's back) puts the API's form in the state, which differs from
// the configuration: a plan to send the configured one again. Left unset,
// tools and MCP servers are not managed: those set through the API stay.
// Skills are not attributes yet.
type agentResource struct{ c *client }

func newAgentResource() resource.Resource { return &agentResource{} }

var (
	_ resource.ResourceWithConfigure   = (*agentResource)(nil)
	_ resource.ResourceWithImportState = (*agentResource)(nil)
)

type agentModel struct {
	ID          types.String `tfsdk:"id"`
	Version     types.Int64  `tfsdk:"version"`
	Name        types.String `tfsdk:"name"`
	Model       types.String `tfsdk:"model"`
	System      types.String `tfsdk:"system"`
	Description types.String `tfsdk:"description"`
	Metadata    types.Map    `tfsdk:"metadata"`
	Tools       types.String `tfsdk:"tools"`
	MCPServers  types.String `tfsdk:"mcp_servers"`
	CreatedAt   types.String `tfsdk:"created_at"`
}

// agentJSON is the part of the API's agent object the resource reads.
type agentJSON struct {
	ID          string `json:"id"`
	Version     int64  `json:"version"`
	Name        string `json:"name"`
	Description string `json:"description"`
	System      string `json:"system"`
	Model       struct {
		ID string `json:"id"`
	} `json:"model"`
	Metadata   map[string]string `json:"metadata"`
	Tools      json.RawMessage   `json:"tools"`
	MCPServers json.RawMessage   `json:"mcp_servers"`
	CreatedAt  string            `json:"created_at"`
	ArchivedAt *string           `json:"archived_at"`
}

// resolvedKey is the private state key of the API's resolved tools and
// MCP servers at the last apply.
const resolvedKey = "resolved"

type resolved struct {
	Tools      string `json:"tools"`
	MCPServers string `json:"mcp_servers"`
}

// canonical is raw re-encoded compactly with sorted keys, so that two
// answers compare equal exactly when they mean the same JSON.
func canonical(raw json.RawMessage) string {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func (r *agentResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_agent"
}

func (r *agentResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "An agent of the provider's tenant (api_key). An update makes a new version; destroy archives the agent.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The agent's id (agent_...). Import with it."},
			"version": schema.Int64Attribute{
				Computed:    true,
				Description: "The current version; each update makes the next.",
			},
			"name":  schema.StringAttribute{Required: true, Description: "1 to 256 characters."},
			"model": schema.StringAttribute{Required: true, Description: "The model id, e.g. claude-sonnet-4-5 (corral's fake model in development)."},
			"system": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString(""),
				Description: "The system prompt.",
			},
			"description": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString(""),
			},
			"metadata": metadataAttribute(),
			"tools": schema.StringAttribute{
				Optional: true, Computed: true, PlanModifiers: keep,
				Description: `The agent's tools as JSON, e.g. jsonencode([{ type = "agent_toolset_20260401" }]). Unset: not managed (the API's are kept).`,
			},
			"mcp_servers": schema.StringAttribute{
				Optional: true, Computed: true, PlanModifiers: keep,
				Description: "The agent's MCP servers as JSON (each referenced by an mcp_toolset in tools). Unset: not managed.",
			},
			"created_at": schema.StringAttribute{Computed: true, PlanModifiers: keep},
		},
	}
}

// metadataAttribute is the string map the REST objects carry; the API
// answers {} for none, which is the default so that leaving it out plans
// no change.
func metadataAttribute() schema.MapAttribute {
	return schema.MapAttribute{
		ElementType: types.StringType, Optional: true, Computed: true,
		Default:     mapdefault.StaticValue(types.MapValueMust(types.StringType, map[string]attr.Value{})),
		Description: "Key-value pairs (the API bounds their number and size).",
	}
}

func (r *agentResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (r *agentResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m agentModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	md := stringMap(ctx, m.Metadata, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	body := map[string]any{
		"name": m.Name.ValueString(), "model": m.Model.ValueString(),
		"system": m.System.ValueString(), "description": m.Description.ValueString(), "metadata": md,
	}
	if !jsonMembers(body, &resp.Diagnostics, map[string]types.String{"tools": m.Tools, "mcp_servers": m.MCPServers}) {
		return
	}
	var out agentJSON
	if err := r.c.rest(ctx, http.MethodPost, "/v1/agents", body, &out); err != nil {
		apiError(&resp.Diagnostics, "Creating an agent", err)
		return
	}
	applied(ctx, &m, out, resp.Private, &resp.Diagnostics)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

// jsonMembers adds to body each JSON text attribute that is set, and
// reports whether all of them are valid JSON.
func jsonMembers(body map[string]any, diags *diag.Diagnostics, attrs map[string]types.String) bool {
	for name, v := range attrs {
		if v.IsNull() || v.IsUnknown() {
			continue
		}
		if !json.Valid([]byte(v.ValueString())) {
			diags.AddAttributeError(path.Root(name), "Invalid JSON", name+" is not valid JSON: use jsonencode(...)")
			return false
		}
		body[name] = json.RawMessage(v.ValueString())
	}
	return true
}

// privateState is the part of the framework's private state the agent
// uses (resp.Private of create, read and update).
type privateState interface {
	GetKey(ctx context.Context, key string) ([]byte, diag.Diagnostics)
	SetKey(ctx context.Context, key string, value []byte) diag.Diagnostics
}

// applied records an agent the API answered after a create or update: the
// configuration's tools and MCP servers stay in the state as written (when
// set), and their resolved forms go to the private state.
func applied(ctx context.Context, m *agentModel, a agentJSON, priv privateState, diags *diag.Diagnostics) {
	tools, servers := m.Tools, m.MCPServers
	setAgent(m, a)
	if !tools.IsNull() && !tools.IsUnknown() {
		m.Tools = tools
	}
	if !servers.IsNull() && !servers.IsUnknown() {
		m.MCPServers = servers
	}
	b, _ := json.Marshal(resolved{Tools: canonical(a.Tools), MCPServers: canonical(a.MCPServers)})
	diags.Append(priv.SetKey(ctx, resolvedKey, b)...)
}

func setAgent(m *agentModel, a agentJSON) {
	m.ID = types.StringValue(a.ID)
	m.Version = types.Int64Value(a.Version)
	m.Name = types.StringValue(a.Name)
	m.Model = types.StringValue(a.Model.ID)
	m.System = types.StringValue(a.System)
	m.Description = types.StringValue(a.Description)
	m.Metadata = mapOf(a.Metadata)
	m.Tools = types.StringValue(canonical(a.Tools))
	m.MCPServers = types.StringValue(canonical(a.MCPServers))
	m.CreatedAt = types.StringValue(a.CreatedAt)
}

func (r *agentResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m agentModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var out agentJSON
	err := r.c.rest(ctx, http.MethodGet, "/v1/agents/"+url.PathEscape(m.ID.ValueString()), nil, &out)
	if notFound(err) || (err == nil && out.ArchivedAt != nil) {
		// Archived behind Terraform's back: a new agent is planned.
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading agent "+m.ID.ValueString(), err)
		return
	}
	// The configuration's text stays while the API's resolved form is the
	// one the last apply saw; otherwise the API's form shows the drift.
	var last resolved
	b, d := req.Private.GetKey(ctx, resolvedKey)
	resp.Diagnostics.Append(d...)
	known := len(b) > 0 && json.Unmarshal(b, &last) == nil
	tools, servers := m.Tools, m.MCPServers
	setAgent(&m, out)
	if known && last.Tools == canonical(out.Tools) && !tools.IsNull() {
		m.Tools = tools
	}
	if known && last.MCPServers == canonical(out.MCPServers) && !servers.IsNull() {
		m.MCPServers = servers
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *agentResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state agentModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	md := metadataPatch(ctx, state.Metadata, plan.Metadata, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	// Only what changed is sent: the API resolves a model given as an id
	// with default effort and speed, which must not replace settings made
	// elsewhere when only the prompt changed.
	body := map[string]any{"version": state.Version.ValueInt64(), "metadata": md}
	for name, v := range map[string][2]types.String{
		"name": {plan.Name, state.Name}, "model": {plan.Model, state.Model},
		"system": {plan.System, state.System}, "description": {plan.Description, state.Description},
	} {
		if !v[0].Equal(v[1]) {
			body[name] = v[0].ValueString()
		}
	}
	changed := map[string]types.String{}
	if !plan.Tools.Equal(state.Tools) {
		changed["tools"] = plan.Tools
	}
	if !plan.MCPServers.Equal(state.MCPServers) {
		changed["mcp_servers"] = plan.MCPServers
	}
	if !jsonMembers(body, &resp.Diagnostics, changed) {
		return
	}
	var out agentJSON
	err := r.c.rest(ctx, http.MethodPost, "/v1/agents/"+url.PathEscape(state.ID.ValueString()), body, &out)
	if err != nil {
		apiError(&resp.Diagnostics, "Updating agent "+state.ID.ValueString(), err)
		return
	}
	applied(ctx, &plan, out, resp.Private, &resp.Diagnostics)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *agentResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m agentModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	err := r.c.rest(ctx, http.MethodPost, "/v1/agents/"+url.PathEscape(m.ID.ValueString())+"/archive", struct{}{}, nil)
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Archiving agent "+m.ID.ValueString(), err)
	}
}

func (r *agentResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}

// stringMap is a map attribute's strings; an empty map when null.
func stringMap(ctx context.Context, m types.Map, diags *diag.Diagnostics) map[string]string {
	out := map[string]string{}
	if m.IsNull() || m.IsUnknown() {
		return out
	}
	diags.Append(m.ElementsAs(ctx, &out, false)...)
	return out
}

// metadataPatch is the metadata member of an update: the API merges it
// into what is stored, so a key Terraform no longer sets is sent as null
// (deleted).
func metadataPatch(ctx context.Context, old, cur types.Map, diags *diag.Diagnostics) map[string]any {
	patch := map[string]any{}
	for k := range stringMap(ctx, old, diags) {
		patch[k] = nil
	}
	for k, v := range stringMap(ctx, cur, diags) {
		patch[k] = v
	}
	return patch
}

func mapOf(m map[string]string) types.Map {
	vs := make(map[string]attr.Value, len(m))
	for k, v := range m {
		vs[k] = types.StringValue(v)
	}
	return types.MapValueMust(types.StringType, vs)
}
