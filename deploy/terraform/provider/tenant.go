package provider

import (
	"context"
	"time"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/booldefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// tenantResource is corral_tenant: CreateTenant, GetTenant, Suspend and
// ResumeTenant, DeleteTenant. The admin API cannot rename a tenant, so a
// new name replaces it (and deletes everything the old one owned: the plan
// says so).
type tenantResource struct{ c *client }

func newTenantResource() resource.Resource { return &tenantResource{} }

var (
	_ resource.ResourceWithConfigure   = (*tenantResource)(nil)
	_ resource.ResourceWithImportState = (*tenantResource)(nil)
)

type tenantModel struct {
	ID        types.String `tfsdk:"id"`
	Name      types.String `tfsdk:"name"`
	Suspended types.Bool   `tfsdk:"suspended"`
	Status    types.String `tfsdk:"status"`
	CreatedAt types.String `tfsdk:"created_at"`
}

func (r *tenantResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_tenant"
}

func (r *tenantResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		Description: "A tenant. Destroying it deletes everything it owns (sessions, sandboxes, agents, keys).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "The tenant's id: tenant_ followed by letters, digits, _ or -.",
			},
			"name": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "Display name. The API cannot rename a tenant: a change replaces it.",
			},
			"suspended": schema.BoolAttribute{
				Optional: true, Computed: true, Default: booldefault.StaticBool(false),
				Description: "Whether the tenant's keys and tokens are refused.",
			},
			"status": schema.StringAttribute{
				Computed: true, Description: `"active" or "suspended".`,
			},
			"created_at": schema.StringAttribute{
				Computed: true, PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
				Description: "When the tenant was created (RFC 3339).",
			},
		},
	}
}

func (r *tenantResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (r *tenantResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m tenantModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.CreateTenantResponse, error) {
		return r.c.tenants().CreateTenant(ctx, &adminv1.CreateTenantRequest{TenantId: m.ID.ValueString(), Name: m.Name.ValueString()})
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Creating tenant "+m.ID.ValueString(), err)
		return
	}
	t := out.GetTenant()
	// Saved before suspending, so that a failed suspension leaves the
	// tenant in the state (and the next apply retries only that).
	suspend := m.Suspended.ValueBool()
	m.Suspended = types.BoolValue(false)
	setTenant(&m, t)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
	if suspend && !resp.Diagnostics.HasError() {
		r.setSuspended(ctx, &m, true, &resp.Diagnostics)
		resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
	}
}

// setSuspended suspends or resumes the tenant and records the outcome in m.
func (r *tenantResource) setSuspended(ctx context.Context, m *tenantModel, suspended bool, diags *diag.Diagnostics) {
	id := m.ID.ValueString()
	var t *adminv1.Tenant
	var err error
	if suspended {
		var out *adminv1.SuspendTenantResponse
		out, err = adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.SuspendTenantResponse, error) {
			return r.c.tenants().SuspendTenant(ctx, &adminv1.SuspendTenantRequest{TenantId: id})
		})
		t = out.GetTenant()
	} else {
		var out *adminv1.ResumeTenantResponse
		out, err = adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.ResumeTenantResponse, error) {
			return r.c.tenants().ResumeTenant(ctx, &adminv1.ResumeTenantRequest{TenantId: id})
		})
		t = out.GetTenant()
	}
	if err != nil {
		diags.AddError("Changing the suspension of tenant "+id, err.Error())
		return
	}
	setTenant(m, t)
}

func setTenant(m *tenantModel, t *adminv1.Tenant) {
	m.ID = types.StringValue(t.GetId())
	m.Name = types.StringValue(t.GetName())
	m.Status = types.StringValue(t.GetStatus())
	m.Suspended = types.BoolValue(t.GetStatus() == "suspended")
	m.CreatedAt = timestamp(t.GetCreatedAt())
}

func (r *tenantResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m tenantModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.GetTenantResponse, error) {
		return r.c.tenants().GetTenant(ctx, &adminv1.GetTenantRequest{TenantId: m.ID.ValueString()})
	})
	if notFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading tenant "+m.ID.ValueString(), err)
		return
	}
	setTenant(&m, out.GetTenant())
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *tenantResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state tenantModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// Only suspended can change in place; id and name replace.
	if plan.Suspended.ValueBool() != state.Suspended.ValueBool() {
		r.setSuspended(ctx, &state, plan.Suspended.ValueBool(), &resp.Diagnostics)
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
}

func (r *tenantResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m tenantModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	_, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.DeleteTenantResponse, error) {
		return r.c.tenants().DeleteTenant(ctx, &adminv1.DeleteTenantRequest{TenantId: m.ID.ValueString()})
	})
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Deleting tenant "+m.ID.ValueString(), err)
	}
}

func (r *tenantResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}

// timestamp is t as RFC 3339 text, null when unset.
func timestamp(t *timestamppb.Timestamp) types.String {
	if t == nil {
		return types.StringNull()
	}
	return types.StringValue(t.AsTime().UTC().Format(time.RFC3339Nano))
}
