package provider

import (
	"context"
	"time"

	"github.com/hashicorp/terraform-plugin-framework/ephemeral"
	"github.com/hashicorp/terraform-plugin-framework/ephemeral/schema"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// joinTokenResource is the ephemeral corral_host_join_token: a one-time
// token a new host joins the fleet with (`corral host --join-token`). It
// is ephemeral because it is a secret that must not land in the state:
// each run issues a fresh one, handed to what provisions the host (a
// write-only argument, a provisioner, a secret store).
type joinTokenResource struct{ c *client }

func newJoinTokenResource() ephemeral.EphemeralResource { return &joinTokenResource{} }

var _ ephemeral.EphemeralResourceWithConfigure = (*joinTokenResource)(nil)

type joinTokenModel struct {
	TTL   types.String `tfsdk:"ttl"`
	Token types.String `tfsdk:"token"`
	CAPin types.String `tfsdk:"ca_pin"`
}

func (r *joinTokenResource) Metadata(_ context.Context, req ephemeral.MetadataRequest, resp *ephemeral.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_host_join_token"
}

func (r *joinTokenResource) Schema(_ context.Context, _ ephemeral.SchemaRequest, resp *ephemeral.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "A one-time host join token, issued on every run and never stored in the state.",
		Attributes: map[string]schema.Attribute{
			"ttl": schema.StringAttribute{
				Optional:    true,
				Description: `How long the token is valid, as a Go duration ("30m", "2h"); default one hour.`,
			},
			"token": schema.StringAttribute{
				Computed: true, Sensitive: true,
				Description: "The token, corral1.<secret>.<CA pin>: give it to `corral host --join-token`.",
			},
			"ca_pin": schema.StringAttribute{Computed: true, Description: "The pin of the fleet CA the host will trust."},
		},
	}
}

func (r *joinTokenResource) Configure(_ context.Context, req ephemeral.ConfigureRequest, resp *ephemeral.ConfigureResponse) {
	r.c = providerClient(req.ProviderData, &resp.Diagnostics)
}

func (r *joinTokenResource) Open(ctx context.Context, req ephemeral.OpenRequest, resp *ephemeral.OpenResponse) {
	var m joinTokenModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	in := &adminv1.IssueJoinTokenRequest{}
	if !m.TTL.IsNull() {
		d, err := time.ParseDuration(m.TTL.ValueString())
		if err != nil || d <= 0 {
			resp.Diagnostics.AddAttributeError(path.Root("ttl"), "Invalid ttl", `ttl must be a positive duration such as "30m" or "2h", got `+m.TTL.String())
			return
		}
		in.Ttl = durationpb.New(d)
	}
	out, err := adminCall(ctx, r.c, func(ctx context.Context) (*adminv1.IssueJoinTokenResponse, error) {
		return r.c.hosts().IssueJoinToken(ctx, in)
	})
	if err != nil {
		apiError(&resp.Diagnostics, "Issuing a host join token", err)
		return
	}
	m.Token, m.CAPin = types.StringValue(out.GetToken()), types.StringValue(out.GetCaPin())
	resp.Diagnostics.Append(resp.Result.Set(ctx, &m)...)
}
