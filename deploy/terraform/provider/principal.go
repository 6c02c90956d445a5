package provider

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/booldefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/setdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// principalResource is corral_principal: a tenant's service principal (it
// holds API keys) or a user created ahead of its first token. Roles and
// disabled change in place; the rest replaces. The admin API deletes no
// principal (the audit log names them), so destroy disables it and
// removes its roles: its keys and tokens are refused from then on.
type principalResource struct{ c *client }

func newPrincipalResource() resource.Resource { return &principalResource{} }

var (
	_ resource.ResourceWithConfigure   = (*principalResource)(nil)
	_ resource.ResourceWithImportState = (*principalResource)(nil)
)

type principalModel struct {
	ID        types.String `tfsdk:"id"`
	TenantID  types.String `tfsdk:"tenant_id"`
	Kind      types.String `tfsdk:"kind"`
	Name      types.String `tfsdk:"name"`
	Issuer    types.String `tfsdk:"issuer"`
	Subject   types.String `tfsdk:"subject"`
	Roles     types.Set    `tfsdk:"roles"`
	Disabled  types.Bool   `tfsdk:"disabled"`
	CreatedAt types.String `tfsdk:"created_at"`
}

func (r *principalResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_principal"
}

func (r *principalResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		Description: "A tenant's service principal or user. Destroy disables it and removes its roles (the API keeps principals for the audit log).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Computed: true, PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
				Description: "The principal's id. Import with <tenant_id>/<id>.",
			},
			"tenant_id": schema.StringAttribute{Required: true, PlanModifiers: replace},
			"kind": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString("service"), PlanModifiers: replace,
				Description: `"service" (holds API keys; the default) or "user" (an OpenID Provider's subject).`,
			},
			"name": schema.StringAttribute{
				Optional: true, Computed: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace(), stringplanmodifier.UseStateForUnknown()},
				Description:   "Required for a service; a user's defaults to its subject.",
			},
			"issuer": schema.StringAttribute{
				Optional: true, PlanModifiers: replace,
				Description: "A user's OpenID Provider (an issuer URL the server trusts).",
			},
			"subject": schema.StringAttribute{
				Optional: true, PlanModifiers: replace,
				Description: "A user's subject at its issuer.",
			},
			"roles": schema.SetAttribute{
				ElementType: types.StringType, Optional: true, Computed: true,
				Default:     setdefault.StaticValue(types.SetValueMust(types.StringType, []attr.Value{})),
				Description: "Tenant roles from policy/roles.yaml; a service principal's keys carry them.",
			},
			"disabled": schema.BoolAttribute{
				Optional: true, Computed: true, Default: booldefault.StaticBool(false),
				Description: "Whether the principal's keys and tokens are refused.",
			},
			"created_at": schema.StringAttribute{
				Computed: true, PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
		},
	}
}

func (r *principalResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (r *principalResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m principalModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	roles := stringSet(ctx, m.Roles, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	tid := m.TenantID.ValueString()
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.CreatePrincipalResponse, error) {
		return r.c.tenants().CreatePrincipal(ctx, &adminv1.CreatePrincipalRequest{
			TenantId: tid, Kind: m.Kind.ValueString(), Name: m.Name.ValueString(),
			Issuer: m.Issuer.ValueString(), Subject: m.Subject.ValueString(), Roles: roles,
		})
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Creating a principal in "+tid, err)
		return
	}
	p := out.GetPrincipal()
	disable := m.Disabled.ValueBool()
	setPrincipal(&m, p)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
	if disable && !resp.Diagnostics.HasError() {
		d, err := r.setDisabled(ctx, tid, p.GetId(), true)
		if err != nil {
			apiError(&resp.Diagnostics, "Disabling principal "+p.GetId(), err)
			return
		}
		setPrincipal(&m, d)
		resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
	}
}

func (r *principalResource) setDisabled(ctx context.Context, tid, id string, disabled bool) (*adminv1.Principal, error) {
	if disabled {
		out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.DisablePrincipalResponse, error) {
			return r.c.tenants().DisablePrincipal(ctx, &adminv1.DisablePrincipalRequest{TenantId: tid, PrincipalId: id})
		})
		return out.GetPrincipal(), err
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.EnablePrincipalResponse, error) {
		return r.c.tenants().EnablePrincipal(ctx, &adminv1.EnablePrincipalRequest{TenantId: tid, PrincipalId: id})
	})
	return out.GetPrincipal(), err
}

func setPrincipal(m *principalModel, p *adminv1.Principal) {
	m.ID = types.StringValue(p.GetId())
	m.TenantID = types.StringValue(p.GetTenantId())
	m.Kind = types.StringValue(p.GetKind())
	m.Name = types.StringValue(p.GetName())
	m.Issuer = optionalString(p.GetIssuer())
	m.Subject = optionalString(p.GetSubject())
	m.Roles = setOf(p.GetRoles())
	m.Disabled = types.BoolValue(p.GetDisabledAt() != nil)
	m.CreatedAt = timestamp(p.GetCreatedAt())
}

func (r *principalResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m principalModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.GetPrincipalResponse, error) {
		return r.c.tenants().GetPrincipal(ctx, &adminv1.GetPrincipalRequest{TenantId: m.TenantID.ValueString(), PrincipalId: m.ID.ValueString()})
	})
	if notFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "Reading principal "+m.ID.ValueString(), err)
		return
	}
	setPrincipal(&m, out.GetPrincipal())
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *principalResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state principalModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	roles := stringSet(ctx, plan.Roles, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	tid, id := state.TenantID.ValueString(), state.ID.ValueString()
	if !plan.Roles.Equal(state.Roles) {
		out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.SetPrincipalRolesResponse, error) {
			return r.c.tenants().SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{TenantId: tid, PrincipalId: id, Roles: roles})
		})
		if err != nil {
			apiError(&resp.Diagnostics, "Setting the roles of principal "+id, err)
			return
		}
		setPrincipal(&state, out.GetPrincipal())
		resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
	}
	if plan.Disabled.ValueBool() != state.Disabled.ValueBool() {
		p, err := r.setDisabled(ctx, tid, id, plan.Disabled.ValueBool())
		if err != nil {
			apiError(&resp.Diagnostics, "Changing whether principal "+id+" is disabled", err)
			return
		}
		setPrincipal(&state, p)
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
}

func (r *principalResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m principalModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	tid, id := m.TenantID.ValueString(), m.ID.ValueString()
	_, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.SetPrincipalRolesResponse, error) {
		return r.c.tenants().SetPrincipalRoles(ctx, &adminv1.SetPrincipalRolesRequest{TenantId: tid, PrincipalId: id})
	})
	if err == nil && !m.Disabled.ValueBool() {
		_, err = r.setDisabled(ctx, tid, id, true)
	}
	if err != nil && !notFound(err) {
		apiError(&resp.Diagnostics, "Disabling principal "+id, err)
	}
}

func (r *principalResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importPair(ctx, req, resp, "tenant_id", "id")
}

// importPair imports an id "<a>/<b>" into the attributes named a and b.
func importPair(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse, a, b string) {
	first, second, ok := strings.Cut(req.ID, "/")
	if !ok || first == "" || second == "" || strings.Contains(second, "/") {
		resp.Diagnostics.AddError("Invalid import id", fmt.Sprintf("want <%s>/<%s>, got %q", a, b, req.ID))
		return
	}
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root(a), first)...)
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root(b), second)...)
}

// stringSet is a set attribute's strings, sorted; nil when null or unknown.
func stringSet(ctx context.Context, s types.Set, diags *diag.Diagnostics) []string {
	if s.IsNull() || s.IsUnknown() {
		return nil
	}
	var out []string
	diags.Append(s.ElementsAs(ctx, &out, false)...)
	slices.Sort(out)
	return out
}

func setOf(ss []string) types.Set {
	vs := make([]attr.Value, len(ss))
	for i, s := range ss {
		vs[i] = types.StringValue(s)
	}
	return types.SetValueMust(types.StringType, vs)
}

// optionalString is s, or null when the API answered "" (unset).
func optionalString(s string) types.String {
	if s == "" {
		return types.StringNull()
	}
	return types.StringValue(s)
}
