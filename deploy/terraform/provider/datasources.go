package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/types"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// The data sources read the admin API: the node that answers (and the
// cluster as it knows it), the fleet's hosts, and one tenant.

func newClusterDataSource() datasource.DataSource { return &clusterDataSource{} }
func newHostsDataSource() datasource.DataSource   { return &hostsDataSource{} }
func newTenantDataSource() datasource.DataSource  { return &tenantDataSource{} }

type clusterDataSource struct{ c *client }

var memberType = types.ObjectType{AttrTypes: map[string]attr.Type{
	"node_id": types.StringType, "raft_addr": types.StringType, "raft_http_addr": types.StringType,
	"voter": types.BoolType, "leader": types.BoolType,
}}

type clusterModel struct {
	NodeID            types.String `tfsdk:"node_id"`
	Version           types.String `tfsdk:"version"`
	LeaderID          types.String `tfsdk:"leader_id"`
	RaftState         types.String `tfsdk:"raft_state"`
	DatabaseReachable types.Bool   `tfsdk:"database_reachable"`
	SchemaVersion     types.Int64  `tfsdk:"schema_version"`
	Members           types.List   `tfsdk:"members"`
}

func (d *clusterDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_cluster"
}

func (d *clusterDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "The control-plane node the provider's grpc_addr reaches, and the cluster's members as it knows them.",
		Attributes: map[string]schema.Attribute{
			"node_id":            schema.StringAttribute{Computed: true},
			"version":            schema.StringAttribute{Computed: true, Description: "The corral version the node runs."},
			"leader_id":          schema.StringAttribute{Computed: true, Description: "The Raft leader's node id; empty when the node knows none."},
			"raft_state":         schema.StringAttribute{Computed: true, Description: "Leader, Follower, Candidate or Shutdown."},
			"database_reachable": schema.BoolAttribute{Computed: true},
			"schema_version":     schema.Int64Attribute{Computed: true},
			"members": schema.ListAttribute{
				ElementType: memberType, Computed: true,
				Description: "Each member: node_id, raft_addr, raft_http_addr, voter, leader.",
			},
		},
	}
}

func (d *clusterDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (d *clusterDataSource) Read(ctx context.Context, _ datasource.ReadRequest, resp *datasource.ReadResponse) {
	out, err := adminCall(ctx, d.c, func(ctx context.Context) (*adminv1.GetStatusResponse, error) {
		return d.c.cluster().GetStatus(ctx, &adminv1.GetStatusRequest{})
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Reading the cluster's status", err)
		return
	}
	members := make([]attr.Value, 0, len(out.GetMembers()))
	for _, m := range out.GetMembers() {
		members = append(members, types.ObjectValueMust(memberType.AttrTypes, map[string]attr.Value{
			"node_id": types.StringValue(m.GetNodeId()), "raft_addr": types.StringValue(m.GetRaftAddr()),
			"raft_http_addr": types.StringValue(m.GetRaftHttpAddr()),
			"voter":          types.BoolValue(m.GetVoter()), "leader": types.BoolValue(m.GetLeader()),
		}))
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &clusterModel{
		NodeID: types.StringValue(out.GetNodeId()), Version: types.StringValue(out.GetVersion()),
		LeaderID: types.StringValue(out.GetLeaderId()), RaftState: types.StringValue(out.GetRaftState()),
		DatabaseReachable: types.BoolValue(out.GetDatabaseReachable()), SchemaVersion: types.Int64Value(out.GetSchemaVersion()),
		Members: types.ListValueMust(memberType, members),
	})...)
}

type hostsDataSource struct{ c *client }

var hostType = types.ObjectType{AttrTypes: map[string]attr.Type{
	"id": types.StringType, "status": types.StringType, "eligible": types.BoolType, "draining": types.BoolType,
	"schedulable": types.BoolType, "runtimes": types.ListType{ElemType: types.StringType},
	"providers": types.ListType{ElemType: types.StringType}, "labels": types.MapType{ElemType: types.StringType},
	"sandboxes": types.Int64Type,
}}

func (d *hostsDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_hosts"
}

func (d *hostsDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "The fleet's hosts, as the admin API lists them.",
		Attributes: map[string]schema.Attribute{
			"hosts": schema.ListAttribute{
				ElementType: hostType, Computed: true,
				Description: "Each host: id, status, eligible, draining, schedulable, runtimes, providers, labels, sandboxes.",
			},
		},
	}
}

func (d *hostsDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (d *hostsDataSource) Read(ctx context.Context, _ datasource.ReadRequest, resp *datasource.ReadResponse) {
	out, err := adminCall(ctx, d.c, func(ctx context.Context) (*adminv1.ListHostsResponse, error) {
		return d.c.hosts().ListHosts(ctx, &adminv1.ListHostsRequest{})
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Listing hosts", err)
		return
	}
	hosts := make([]attr.Value, 0, len(out.GetHosts()))
	for _, h := range out.GetHosts() {
		hosts = append(hosts, types.ObjectValueMust(hostType.AttrTypes, map[string]attr.Value{
			"id": types.StringValue(h.GetId()), "status": types.StringValue(h.GetStatus()),
			"eligible": types.BoolValue(h.GetEligible()), "draining": types.BoolValue(h.GetDraining()),
			"schedulable": types.BoolValue(h.GetSchedulable()),
			"runtimes":    stringList(h.GetRuntimes()), "providers": stringList(h.GetProviders()),
			"labels": mapOf(h.GetLabels()), "sandboxes": types.Int64Value(int64(h.GetSandboxes())),
		}))
	}
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("hosts"), types.ListValueMust(hostType, hosts))...)
}

type tenantDataSource struct{ c *client }

func (d *tenantDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_tenant"
}

func (d *tenantDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "One tenant, by id.",
		Attributes: map[string]schema.Attribute{
			"id":         schema.StringAttribute{Required: true},
			"name":       schema.StringAttribute{Computed: true},
			"suspended":  schema.BoolAttribute{Computed: true},
			"status":     schema.StringAttribute{Computed: true},
			"created_at": schema.StringAttribute{Computed: true},
		},
	}
}

func (d *tenantDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (d *tenantDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var m tenantModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	out, err := adminCall(ctx, d.c, func(ctx context.Context) (*adminv1.GetTenantResponse, error) {
		return d.c.tenants().GetTenant(ctx, &adminv1.GetTenantRequest{TenantId: m.ID.ValueString()})
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Reading tenant "+m.ID.ValueString(), err)
		return
	}
	setTenant(&m, out.GetTenant())
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func stringList(ss []string) types.List {
	vs := make([]attr.Value, len(ss))
	for i, s := range ss {
		vs[i] = types.StringValue(s)
	}
	return types.ListValueMust(types.StringType, vs)
}
