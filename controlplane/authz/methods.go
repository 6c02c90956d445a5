package authz

import "strings"

// Methods maps every admin gRPC method to its rule: a full method name, or
// "/<service>/*" for every method of a fleet service. The gRPC interceptor
// refuses any method that matches neither, so a new method is closed until
// it is listed here.
var Methods = map[string]Rule{
	// Fleet services: operators only.
	"/corral.admin.v1.ClusterService/*":                     {Fleet: A("cluster", "operate")},
	"/corral.admin.v1.ClusterService/GetStatus":             {Fleet: A("cluster", "read")},
	"/corral.admin.v1.ClusterService/ListMembers":           {Fleet: A("cluster", "read")},
	"/corral.admin.v1.HostsService/*":                       {Fleet: A("hosts", "operate")},
	"/corral.admin.v1.HostsService/ListHosts":               {Fleet: A("hosts", "read")},
	"/corral.admin.v1.HostsService/IssueJoinToken":          {Fleet: A("hosts", "operate")},
	"/corral.admin.v1.OperatorKeysService/*":                {Fleet: A("operator_keys", "write")},
	"/corral.admin.v1.OperatorKeysService/ListOperatorKeys": {Fleet: A("operator_keys", "read")},
	"/corral.admin.v1.SandboxesService/*":                   {Fleet: A("hosts", "operate")},
	"/corral.admin.v1.SandboxesService/ListSandboxes":       {Fleet: A("hosts", "read")},
	"/corral.admin.v1.TenantsService/CreateTenant":          {Fleet: A("tenants", "write")},
	"/corral.admin.v1.TenantsService/ListTenants":           {Fleet: A("tenants", "read")},
	"/corral.admin.v1.TenantsService/GetTenant":             {Tenant: A("quotas", "read"), Fleet: A("tenants", "read")},
	"/corral.admin.v1.TenantsService/SuspendTenant":         {Fleet: A("tenants", "write")},
	"/corral.admin.v1.TenantsService/ResumeTenant":          {Fleet: A("tenants", "write")},
	"/corral.admin.v1.TenantsService/DeleteTenant":          {Fleet: A("tenants", "write")},
	// A tenant's admins manage their own keys; operators any tenant's (to
	// hand a new tenant its first key).
	"/corral.admin.v1.TenantsService/CreateAPIKey": {Tenant: A("api_keys", "write"), Fleet: A("tenant_keys", "write")},
	"/corral.admin.v1.TenantsService/ListAPIKeys":  {Tenant: A("api_keys", "read"), Fleet: A("tenant_keys", "read")},
	"/corral.admin.v1.TenantsService/RevokeAPIKey": {Tenant: A("api_keys", "write"), Fleet: A("tenant_keys", "write")},
	// Environment keys are API keys, of a self-hosted environment.
	"/corral.admin.v1.TenantsService/CreateEnvironmentKey": {Tenant: A("api_keys", "write"), Fleet: A("tenant_keys", "write")},
	// Likewise their users and service principals.
	"/corral.admin.v1.TenantsService/CreatePrincipal":   {Tenant: A("principals", "write"), Fleet: A("tenant_principals", "write")},
	"/corral.admin.v1.TenantsService/ListPrincipals":    {Tenant: A("principals", "read"), Fleet: A("tenant_principals", "read")},
	"/corral.admin.v1.TenantsService/GetPrincipal":      {Tenant: A("principals", "read"), Fleet: A("tenant_principals", "read")},
	"/corral.admin.v1.TenantsService/SetPrincipalRoles": {Tenant: A("principals", "write"), Fleet: A("tenant_principals", "write")},
	"/corral.admin.v1.TenantsService/DisablePrincipal":  {Tenant: A("principals", "write"), Fleet: A("tenant_principals", "write")},
	"/corral.admin.v1.TenantsService/EnablePrincipal":   {Tenant: A("principals", "write"), Fleet: A("tenant_principals", "write")},
	"/corral.admin.v1.TenantsService/GetQuota":          {Tenant: A("quotas", "read"), Fleet: A("tenant_quotas", "read")},
	"/corral.admin.v1.TenantsService/SetQuota":          {Fleet: A("tenant_quotas", "write")},
	"/corral.admin.v1.TenantsService/ListAuditLog":      {Tenant: A("audit", "read"), Fleet: A("fleet_audit", "read")},
	// Usage for billing: a tenant's admins read their own, operators
	// every tenant's.
	"/corral.admin.v1.UsageService/GetUsage":    {Tenant: A("usage", "read"), Fleet: A("fleet_usage", "read")},
	"/corral.admin.v1.UsageService/ExportUsage": {Tenant: A("usage", "read"), Fleet: A("fleet_usage", "read")},
	// The egress trail is part of the audit trail.
	"/corral.admin.v1.TenantsService/ListEgressConnections": {Tenant: A("audit", "read"), Fleet: A("fleet_audit", "read")},
	// Builds are an environment's state; operators read them as they
	// read the audit trail, to see why a tenant's builds fail.
	"/corral.admin.v1.TenantsService/ListEnvironmentBuilds": {Tenant: A("environments", "read"), Fleet: A("fleet_audit", "read")},
}

// MethodRule returns the rule of a full gRPC method name, and false when the
// table has none (the method must then be refused).
func MethodRule(fullMethod string) (Rule, bool) {
	if r, ok := Methods[fullMethod]; ok {
		return r, true
	}
	i := strings.LastIndexByte(fullMethod, '/')
	if i <= 0 {
		return Rule{}, false
	}
	r, ok := Methods[fullMethod[:i]+"/*"]
	return r, ok
}
