package provider

import (
	"context"
	"errors"
	"os"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/ephemeral"
	tfprovider "github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"corral.dev/corral/internal/errdefs"
)

// The environment variables the provider reads when its configuration
// leaves a setting out. They are the names `corral dev` writes into
// .corral/dev.env and the corral CLI reads, so `source .corral/dev.env`
// configures all three.
const (
	envURL         = "CORRAL_URL"
	envGRPCAddr    = "CORRAL_GRPC_ADDR"
	envAPIKey      = "CORRAL_API_KEY"
	envOperatorKey = "CORRAL_OPERATOR_KEY"
	envTLSCA       = "CORRAL_TLS_CA"
)

// New returns the provider factory that providerserver serves; version is
// the binary's.
func New(version string) func() tfprovider.Provider {
	return func() tfprovider.Provider { return &corralProvider{version: version} }
}

type corralProvider struct{ version string }

var (
	_ tfprovider.Provider                       = (*corralProvider)(nil)
	_ tfprovider.ProviderWithEphemeralResources = (*corralProvider)(nil)
)

type providerModel struct {
	URL         types.String `tfsdk:"url"`
	GRPCAddr    types.String `tfsdk:"grpc_addr"`
	APIKey      types.String `tfsdk:"api_key"`
	OperatorKey types.String `tfsdk:"operator_key"`
	CAFile      types.String `tfsdk:"ca_file"`
	CAPEM       types.String `tfsdk:"ca_pem"`
	Insecure    types.Bool   `tfsdk:"insecure"`
}

func (p *corralProvider) Metadata(_ context.Context, _ tfprovider.MetadataRequest, resp *tfprovider.MetadataResponse) {
	resp.TypeName = "corral"
	resp.Version = p.version
}

func (p *corralProvider) Schema(_ context.Context, _ tfprovider.SchemaRequest, resp *tfprovider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Manages a corral control plane: tenants, principals, API keys and quotas through the admin API (gRPC), and a tenant's agents, environments and vaults through the public REST API.",
		Attributes: map[string]schema.Attribute{
			"url": schema.StringAttribute{
				Optional:    true,
				Description: "Base URL of the public REST API, e.g. https://corral.example:8080 (default $CORRAL_URL). Needed by corral_agent, corral_environment, corral_vault and corral_vault_credential.",
			},
			"grpc_addr": schema.StringAttribute{
				Optional:    true,
				Description: "Address of the admin API (gRPC), host:port or https://host:port (default $CORRAL_GRPC_ADDR). Needed by the tenant, principal, API key, quota and fleet resources and data sources.",
			},
			"api_key": schema.StringAttribute{
				Optional: true, Sensitive: true,
				Description: "A tenant's API key for the REST API (default $CORRAL_API_KEY). The REST resources are that tenant's.",
			},
			"operator_key": schema.StringAttribute{
				Optional: true, Sensitive: true,
				Description: "An operator key for the admin API (default $CORRAL_OPERATOR_KEY; `corral admin bootstrap-key` issues the first).",
			},
			"ca_file": schema.StringAttribute{
				Optional:    true,
				Description: "PEM file of the CA that signed the servers' certificates, in place of the system's roots (default $CORRAL_TLS_CA). Conflicts with ca_pem.",
			},
			"ca_pem": schema.StringAttribute{
				Optional:    true,
				Description: "The same CA as PEM text, e.g. from the control-plane module's outputs. Conflicts with ca_file.",
			},
			"insecure": schema.BoolAttribute{
				Optional:    true,
				Description: "Speak plaintext even beyond loopback: keys cross the network in the clear. Plaintext to a loopback address needs no setting.",
			},
		},
	}
}

func (p *corralProvider) Configure(ctx context.Context, req tfprovider.ConfigureRequest, resp *tfprovider.ConfigureResponse) {
	var m providerModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// A setting that comes from a resource of the same configuration (an
	// api_key from corral_api_key) is unknown until that resource exists.
	// The provider then has no client; anything it is asked before apply
	// says so (see client.admin and client.rest).
	for _, v := range []types.String{m.URL, m.GRPCAddr, m.APIKey, m.OperatorKey, m.CAFile, m.CAPEM} {
		if v.IsUnknown() {
			return
		}
	}
	setting := func(v types.String, env string) string {
		if !v.IsNull() {
			return v.ValueString()
		}
		return os.Getenv(env)
	}
	c := &client{
		apiKey:      setting(m.APIKey, envAPIKey),
		operatorKey: setting(m.OperatorKey, envOperatorKey),
	}
	var pem []byte
	what := "ca_pem"
	switch {
	case !m.CAPEM.IsNull() && !m.CAFile.IsNull():
		resp.Diagnostics.AddError("Invalid provider configuration", "ca_file and ca_pem are both set: give the CA one way")
		return
	case !m.CAPEM.IsNull():
		pem = []byte(m.CAPEM.ValueString())
	default:
		if f := setting(m.CAFile, envTLSCA); f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				resp.Diagnostics.AddError("Invalid provider configuration", "reading ca_file: "+err.Error())
				return
			}
			pem, what = b, "ca_file "+f
		}
	}
	roots, err := caPool(pem, what)
	if err != nil {
		resp.Diagnostics.AddError("Invalid provider configuration", err.Error())
		return
	}
	insecureOK := m.Insecure.ValueBool()
	if addr := setting(m.GRPCAddr, envGRPCAddr); addr != "" {
		if c.conn, err = dialAdmin(addr, roots, insecureOK); err != nil {
			resp.Diagnostics.AddError("Invalid provider configuration", err.Error())
			return
		}
		c.grpcAddr = addr
	}
	if u := setting(m.URL, envURL); u != "" {
		if c.http, c.restURL, err = restClient(u, roots, insecureOK); err != nil {
			resp.Diagnostics.AddError("Invalid provider configuration", err.Error())
			return
		}
	}
	resp.ResourceData, resp.DataSourceData, resp.EphemeralResourceData = c, c, c
}

func (p *corralProvider) Resources(context.Context) []func() resource.Resource {
	return []func() resource.Resource{
		newTenantResource, newPrincipalResource, newAPIKeyResource, newQuotaResource,
		newAgentResource, newEnvironmentResource, newVaultResource, newCredentialResource,
	}
}

func (p *corralProvider) DataSources(context.Context) []func() datasource.DataSource {
	return []func() datasource.DataSource{newClusterDataSource, newHostsDataSource, newTenantDataSource}
}

func (p *corralProvider) EphemeralResources(context.Context) []func() ephemeral.EphemeralResource {
	return []func() ephemeral.EphemeralResource{newJoinTokenResource}
}

// providerClient is the client a resource's Configure receives: nil before
// the provider is configured (validation) or while its settings are unknown.
func providerClient(data any, diags *diag.Diagnostics) *client {
	if data == nil {
		return nil
	}
	c, ok := data.(*client)
	if !ok {
		diags.AddError("Unexpected provider data", "the corral provider passed something other than its client; this is a bug")
		return nil
	}
	return c
}

// apiError adds err, from what the API answered or why no answer came, as
// a diagnostic whose detail is the API's own message.
func apiError(diags *diag.Diagnostics, what string, err error) {
	diags.AddError(what, err.Error())
}

// notFound reports whether err is the API saying the object does not
// exist: a read drops it from the state, a delete counts it done.
func notFound(err error) bool {
	var e *errdefs.Error
	return errors.As(err, &e) && e.Kind == errdefs.NotFoundKind
}
