package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-framework/types"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// quotaResource is corral_tenant_quota: a tenant's own limits (SetQuota's
// overrides). A limit left unset takes policy/quotas.yaml's default;
// destroy removes every override. The limits in force are read back in
// effective.
type quotaResource struct{ c *client }

func newQuotaResource() resource.Resource { return &quotaResource{} }

var (
	_ resource.ResourceWithConfigure   = (*quotaResource)(nil)
	_ resource.ResourceWithImportState = (*quotaResource)(nil)
)

// quotaLimits names each limit once: its attribute, its description and
// where it sits in the wire types.
var quotaLimits = []struct {
	name, desc string
	override   func(*adminv1.QuotaOverride) **int32
	effective  func(*adminv1.Quota) int32
}{
	{"concurrent_sessions", "Sessions running at once.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.ConcurrentSessions }, (*adminv1.Quota).GetConcurrentSessions},
	{"concurrent_sandboxes", "Sandboxes at once.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.ConcurrentSandboxes }, (*adminv1.Quota).GetConcurrentSandboxes},
	{"cpu_millis", "CPU across the tenant's sandboxes, in millicores.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.CpuMillis }, (*adminv1.Quota).GetCpuMillis},
	{"memory_mib", "Memory across the tenant's sandboxes, in MiB.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.MemoryMib }, (*adminv1.Quota).GetMemoryMib},
	{"requests_per_second", "API requests per second, per control-plane node.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.RequestsPerSecond }, (*adminv1.Quota).GetRequestsPerSecond},
	{"request_burst", "API request burst, per control-plane node.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.RequestBurst }, (*adminv1.Quota).GetRequestBurst},
	{"file_storage_mib", "What the tenant's files (the Files API) may hold together, in MiB.",
		func(o *adminv1.QuotaOverride) **int32 { return &o.FileStorageMib }, (*adminv1.Quota).GetFileStorageMib},
}

var effectiveTypes = func() map[string]attr.Type {
	m := map[string]attr.Type{}
	for _, l := range quotaLimits {
		m[l.name] = types.Int32Type
	}
	return m
}()

func (r *quotaResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_tenant_quota"
}

func (r *quotaResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	attrs := map[string]schema.Attribute{
		"id": schema.StringAttribute{
			Computed: true, PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			Description: "The tenant's id. Import with it.",
		},
		"tenant_id": schema.StringAttribute{Required: true, PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()}},
	}
	eff := map[string]schema.Attribute{}
	for _, l := range quotaLimits {
		attrs[l.name] = schema.Int32Attribute{Optional: true, Description: l.desc + " Above zero; unset takes the default."}
		eff[l.name] = schema.Int32Attribute{Computed: true}
	}
	attrs["effective"] = schema.SingleNestedAttribute{
		Computed: true, Attributes: eff,
		Description: "The limits in force: the overrides over policy/quotas.yaml's defaults.",
	}
	resp.Schema = schema.Schema{
		Description: "A tenant's quota overrides. Destroy returns every limit to its default.",
		Attributes:  attrs,
	}
}

func (r *quotaResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

// set sends the overrides in the plan (or config) and records the answer.
func (r *quotaResource) set(ctx context.Context, plan tfsdk.Plan, state *tfsdk.State, diags *diag.Diagnostics) {
	var tid types.String
	diags.Append(plan.GetAttribute(ctx, path.Root("tenant_id"), &tid)...)
	o := &adminv1.QuotaOverride{}
	for _, l := range quotaLimits {
		var v types.Int32
		diags.Append(plan.GetAttribute(ctx, path.Root(l.name), &v)...)
		if !v.IsNull() && !v.IsUnknown() {
			n := v.ValueInt32()
			*l.override(o) = &n
		}
	}
	if diags.HasError() {
		return
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.SetQuotaResponse, error) {
		return r.c.tenants().SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: tid.ValueString(), Overrides: o})
	})
	if err != nil {
		apiError(diags, "Setting the quota of "+tid.ValueString(), err)
		return
	}
	writeQuota(ctx, tid.ValueString(), out.GetOverrides(), out.GetEffective(), state, diags)
}

func writeQuota(ctx context.Context, tid string, o *adminv1.QuotaOverride, eff *adminv1.Quota, state *tfsdk.State, diags *diag.Diagnostics) {
	diags.Append(state.SetAttribute(ctx, path.Root("id"), tid)...)
	diags.Append(state.SetAttribute(ctx, path.Root("tenant_id"), tid)...)
	vals := map[string]attr.Value{}
	for _, l := range quotaLimits {
		v := types.Int32Null()
		if o != nil {
			if p := *l.override(o); p != nil {
				v = types.Int32Value(*p)
			}
		}
		diags.Append(state.SetAttribute(ctx, path.Root(l.name), v)...)
		vals[l.name] = types.Int32Value(l.effective(eff))
	}
	obj, d := types.ObjectValue(effectiveTypes, vals)
	diags.Append(d...)
	diags.Append(state.SetAttribute(ctx, path.Root("effective"), obj)...)
}

func (r *quotaResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	r.set(ctx, req.Plan, &resp.State, &resp.Diagnostics)
}

func (r *quotaResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	r.set(ctx, req.Plan, &resp.State, &resp.Diagnostics)
}

func (r *quotaResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var tid types.String
	resp.Diagnostics.Append(req.State.GetAttribute(ctx, path.Root("id"), &tid)...)
	if resp.Diagnostics.HasError() {
		return
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.GetQuotaResponse, error) {
		return r.c.tenants().GetQuota(ctx, &adminv1.GetQuotaRequest{TenantId: tid.ValueString()})
	})
	if notFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading the quota of "+tid.ValueString(), err)
		return
	}
	writeQuota(ctx, tid.ValueString(), out.GetOverrides(), out.GetEffective(), &resp.State, &resp.Diagnostics)
}

func (r *quotaResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var tid types.String
	resp.Diagnostics.Append(req.State.GetAttribute(ctx, path.Root("id"), &tid)...)
	if resp.Diagnostics.HasError() {
		return
	}
	_, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.SetQuotaResponse, error) {
		return r.c.tenants().SetQuota(ctx, &adminv1.SetQuotaRequest{TenantId: tid.ValueString(), Overrides: &adminv1.QuotaOverride{}})
	})
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Removing the quota overrides of "+tid.ValueString(), err)
	}
}

func (r *quotaResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}
