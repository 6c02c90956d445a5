// Package provider is corral's Terraform provider (terraform-plugin-framework,
// plugin protocol v6), served by cmd/terraform-provider-corral. It is a
// client of corral's two APIs and nothing else:
//
//	terraform ──plugin protocol──▶ provider ──admin API (gRPC, operator key)──▶ tenants, principals,
//	                                   │                                        API keys, quotas, hosts,
//	                                   │                                        cluster, join tokens
//	                                   └──REST /v1 (x-api-key, a tenant's)────▶ agents, environments,
//	                                                                            vaults, credentials
//
// Each resource reads back everything it sets and normalises the server's
// defaults into its schema's defaults, so that a second plan after apply
// shows no change; an object gone (or archived) behind Terraform's back is
// dropped from the state and planned again. Errors from either API become
// diagnostics carrying the API's own message.
//
// It lives here, beside the fleet modules, rather than under internal/:
// internal/ holds what sits below both daemons (internal/archtest), and
// the provider is an admin API client whose acceptance tests start a real
// control plane in process.
package provider

// Address is the provider's source address: what a configuration's
// required_providers and a dev_overrides CLI configuration name.
const Address = "registry.terraform.io/corral/corral"
