package api

import (
	"context"
	"encoding/json"
	"log/slog"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/blob"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// SandboxReaper destroys a tenant's sandboxes when the tenant is deleted.
// The fleet implements it; it must be idempotent and return only when none
// of the tenant's sandboxes runs any more.
type SandboxReaper interface {
	DestroyTenantSandboxes(ctx context.Context, id tenant.ID) error
}

// TenantsService implements corral.admin.v1.TenantsService. The gRPC
// interceptor has authenticated and authorized each call, and has kept a
// tenant's principals to their own tenant, before a method runs.
type TenantsService struct {
	adminv1.UnimplementedTenantsServiceServer

	Store  *store.Store
	Policy *policy.Policy
	Authn  *auth.Authenticator
	Quotas *quota.Quotas
	// Sandboxes receives sandbox limits when they are set; nil until the
	// fleet's quota enforcement is wired (the overrides are stored anyway).
	Sandboxes quota.SandboxQuotaSetter
	// Reaper destroys a deleted tenant's sandboxes; nil until sandboxes are
	// wired.
	Reaper SandboxReaper
	// StopSessions ends this node's loops of the tenant's sessions; may be nil.
	StopSessions func(tenant.ID)
	// BuildKey returns the key of the build an environment's packages name
	// now ("" for none; ctx carries the tenant), for ListEnvironmentBuilds'
	// environment_id. Nil: that filter is refused.
	BuildKey func(ctx context.Context, environmentID string) (string, error)
	// Blobs holds the tenant's files' content, deleted with the tenant;
	// may be nil (no files are kept).
	Blobs  blob.Store
	Logger *slog.Logger
}

var _ adminv1.TenantsServiceServer = (*TenantsService)(nil)

// target is the tenant a call acts on: the caller's own for tenant
// principals, else the request's.
func target(ctx context.Context, requested string) (tenant.ID, error) {
	if p, ok := auth.From(ctx); ok && !p.Fleet() {
		return p.Tenant, nil
	}
	id := tenant.ID(requested)
	if id == "" {
		return "", errdefs.InvalidArgument("tenant_id is required")
	}
	if id.Validate() != nil {
		return "", errdefs.NotFound("tenant %s not found", id)
	}
	return id, nil
}

// inTenant returns ctx scoped to the tenant a call acts on (see target),
// and that tenant, once it is known to exist.
func (s *TenantsService) inTenant(ctx context.Context, requested string) (context.Context, tenant.ID, error) {
	id, err := target(ctx, requested)
	if err != nil {
		return nil, "", err
	}
	if _, err := s.Store.Tenants().Get(ctx, id); err != nil {
		return nil, "", err
	}
	return tenant.With(ctx, id), id, nil
}

func tenantPB(t store.Tenant) *adminv1.Tenant {
	return &adminv1.Tenant{Id: string(t.ID), Name: t.Name, Status: t.Status, CreatedAt: timestamppb.New(t.CreatedAt)}
}

// CreateTenant adds a tenant.
func (s *TenantsService) CreateTenant(ctx context.Context, req *adminv1.CreateTenantRequest) (*adminv1.CreateTenantResponse, error) {
	t, err := s.Store.Tenants().Create(ctx, tenant.ID(req.GetTenantId()), req.GetName())
	if err != nil {
		return nil, err
	}
	return &adminv1.CreateTenantResponse{Tenant: tenantPB(t)}, nil
}

// ListTenants lists every tenant.
func (s *TenantsService) ListTenants(ctx context.Context, _ *adminv1.ListTenantsRequest) (*adminv1.ListTenantsResponse, error) {
	ts, err := s.Store.Tenants().List(ctx)
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListTenantsResponse{}
	for _, t := range ts {
		out.Tenants = append(out.Tenants, tenantPB(t))
	}
	return out, nil
}

// GetTenant describes one tenant.
func (s *TenantsService) GetTenant(ctx context.Context, req *adminv1.GetTenantRequest) (*adminv1.GetTenantResponse, error) {
	id, err := target(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	t, err := s.Store.Tenants().Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return &adminv1.GetTenantResponse{Tenant: tenantPB(t)}, nil
}

// SuspendTenant refuses the tenant's credentials from now on.
func (s *TenantsService) SuspendTenant(ctx context.Context, req *adminv1.SuspendTenantRequest) (*adminv1.SuspendTenantResponse, error) {
	t, err := s.setStatus(ctx, req.GetTenantId(), store.TenantSuspended)
	if err != nil {
		return nil, err
	}
	return &adminv1.SuspendTenantResponse{Tenant: tenantPB(t)}, nil
}

// ResumeTenant lifts a suspension.
func (s *TenantsService) ResumeTenant(ctx context.Context, req *adminv1.ResumeTenantRequest) (*adminv1.ResumeTenantResponse, error) {
	t, err := s.setStatus(ctx, req.GetTenantId(), store.TenantActive)
	if err != nil {
		return nil, err
	}
	return &adminv1.ResumeTenantResponse{Tenant: tenantPB(t)}, nil
}

func (s *TenantsService) setStatus(ctx context.Context, requested, status string) (store.Tenant, error) {
	id, err := target(ctx, requested)
	if err != nil {
		return store.Tenant{}, err
	}
	t, err := s.Store.Tenants().SetStatus(ctx, id, status)
	if err != nil {
		return store.Tenant{}, err
	}
	s.Authn.Forget()
	return t, nil
}

// DeleteTenant suspends the tenant (its credentials stop working), cancels
// its session loops on this node, destroys its sandboxes, and deletes every
// row it owns in one transaction, which ends its sessions' event streams on
// every node. Loops on other nodes find their sessions gone at their next
// step and stop.
func (s *TenantsService) DeleteTenant(ctx context.Context, req *adminv1.DeleteTenantRequest) (*adminv1.DeleteTenantResponse, error) {
	id, err := target(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	if _, err := s.setStatus(ctx, string(id), store.TenantSuspended); err != nil {
		return nil, err
	}
	if s.StopSessions != nil {
		s.StopSessions(id)
	}
	if s.Reaper != nil {
		if err := s.Reaper.DestroyTenantSandboxes(ctx, id); err != nil {
			return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "destroying the sandboxes of %s (the tenant stays suspended; retry the delete)", id)
		}
	}
	// The files' content goes before their rows, while the suspended
	// tenant cannot read them: a failure leaves rows to retry with.
	if s.Blobs != nil {
		if err := s.Blobs.DeletePrefix(ctx, store.FilesBlobPrefix(string(id))); err != nil {
			return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "deleting the files of %s (the tenant stays suspended; retry the delete)", id)
		}
		if err := s.Blobs.DeletePrefix(ctx, store.SkillsBlobPrefix(string(id))); err != nil {
			return nil, errdefs.Wrap(errdefs.UnavailableKind, err, "deleting the skills of %s (the tenant stays suspended; retry the delete)", id)
		}
	}
	if err := s.Store.Tenants().Delete(ctx, id); err != nil {
		return nil, err
	}
	s.Authn.Forget()
	s.Quotas.Forget(id)
	s.logger().Info("tenant deleted", "tenant_id", id)
	return &adminv1.DeleteTenantResponse{}, nil
}

func (s *TenantsService) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func apiKeyPB(k store.APIKey) *adminv1.APIKey {
	pb := &adminv1.APIKey{
		Id: k.ID, TenantId: string(k.TenantID), Name: k.Name, Principal: k.Principal, PrincipalId: k.PrincipalID,
		Roles: k.Roles, Prefix: k.Prefix, CreatedAt: timestamppb.New(k.CreatedAt), EnvironmentId: k.EnvironmentID,
	}
	if k.RevokedAt != nil {
		pb.RevokedAt = timestamppb.New(*k.RevokedAt)
	}
	if k.LastUsedAt != nil {
		pb.LastUsedAt = timestamppb.New(*k.LastUsedAt)
	}
	return pb
}

// CreateAPIKey issues a key of a service principal: an existing one, or a
// new one named after the key with tenant roles only.
func (s *TenantsService) CreateAPIKey(ctx context.Context, req *adminv1.CreateAPIKeyRequest) (*adminv1.CreateAPIKeyResponse, error) {
	if err := s.tenantRoles(req.GetRoles()); err != nil {
		return nil, err
	}
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	k, secret, err := s.Store.APIKeys().Issue(tctx, store.NewAPIKey{Name: req.GetName(), PrincipalID: req.GetPrincipalId(), Roles: req.GetRoles()})
	if err != nil {
		return nil, err
	}
	return &adminv1.CreateAPIKeyResponse{ApiKey: apiKeyPB(k), Secret: secret.Reveal()}, nil
}

// CreateEnvironmentKey issues an environment key for a self_hosted
// environment of the tenant.
func (s *TenantsService) CreateEnvironmentKey(ctx context.Context, req *adminv1.CreateEnvironmentKeyRequest) (*adminv1.CreateEnvironmentKeyResponse, error) {
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	env, err := s.Store.Environments().Get(tctx, req.GetEnvironmentId())
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(env.Config, &cfg) != nil || cfg.Type != "self_hosted" {
		return nil, errdefs.InvalidArgument("environment %s is not self_hosted: only a self_hosted environment has workers to hold its keys", env.ID)
	}
	k, secret, err := s.Store.APIKeys().IssueEnvironmentKey(tctx, env.ID, req.GetName())
	if err != nil {
		return nil, err
	}
	return &adminv1.CreateEnvironmentKeyResponse{ApiKey: apiKeyPB(k), Secret: secret.Reveal()}, nil
}

// ListAPIKeys lists the tenant's keys, or one principal's.
func (s *TenantsService) ListAPIKeys(ctx context.Context, req *adminv1.ListAPIKeysRequest) (*adminv1.ListAPIKeysResponse, error) {
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	keys, err := s.Store.APIKeys().List(tctx, req.GetPrincipalId())
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListAPIKeysResponse{}
	for _, k := range keys {
		out.ApiKeys = append(out.ApiKeys, apiKeyPB(k))
	}
	return out, nil
}

// RevokeAPIKey revokes a key; this node refuses it at once, others within
// seconds (auth's key cache).
func (s *TenantsService) RevokeAPIKey(ctx context.Context, req *adminv1.RevokeAPIKeyRequest) (*adminv1.RevokeAPIKeyResponse, error) {
	id, err := target(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	k, err := s.Store.APIKeys().Revoke(tenant.With(ctx, id), req.GetKeyId())
	if err != nil {
		return nil, err
	}
	s.Authn.Forget()
	return &adminv1.RevokeAPIKeyResponse{ApiKey: apiKeyPB(k)}, nil
}

func quotaPB(q policy.Quota) *adminv1.Quota {
	return &adminv1.Quota{
		ConcurrentSessions: int32(q.ConcurrentSessions), ConcurrentSandboxes: int32(q.ConcurrentSandboxes),
		CpuMillis: int32(q.CPUMillis), MemoryMib: int32(q.MemoryMiB),
		RequestsPerSecond: int32(q.RequestsPerSecond), RequestBurst: int32(q.RequestBurst),
		FileStorageMib:    int32(q.FileStorageBytes() >> 20),
		ModelTokensPerDay: q.ModelTokensPerDay,
	}
}

func overridePB(o store.QuotaOverride) *adminv1.QuotaOverride {
	return &adminv1.QuotaOverride{
		ConcurrentSessions: o.ConcurrentSessions, ConcurrentSandboxes: o.ConcurrentSandboxes,
		CpuMillis: o.CPUMillis, MemoryMib: o.MemoryMiB,
		RequestsPerSecond: o.RequestsPerSecond, RequestBurst: o.RequestBurst,
		FileStorageMib:    o.FileStorageMiB,
		ModelTokensPerDay: o.ModelTokensPerDay,
	}
}

// GetQuota returns the tenant's limits and overrides.
func (s *TenantsService) GetQuota(ctx context.Context, req *adminv1.GetQuotaRequest) (*adminv1.GetQuotaResponse, error) {
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	o, err := s.Store.Quotas().Get(tctx)
	if err != nil {
		return nil, err
	}
	return &adminv1.GetQuotaResponse{Effective: quotaPB(s.Quotas.Apply(o)), Overrides: overridePB(o)}, nil
}

// SetQuota stores the tenant's overrides, applies them on this node at once
// (other nodes within 30s), and hands the sandbox limits to the fleet.
func (s *TenantsService) SetQuota(ctx context.Context, req *adminv1.SetQuotaRequest) (*adminv1.SetQuotaResponse, error) {
	tctx, id, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	in := req.GetOverrides()
	o, err := s.Store.Quotas().Set(tctx, store.QuotaOverride{
		ConcurrentSessions: in.ConcurrentSessions, ConcurrentSandboxes: in.ConcurrentSandboxes,
		CPUMillis: in.CpuMillis, MemoryMiB: in.MemoryMib,
		RequestsPerSecond: in.RequestsPerSecond, RequestBurst: in.RequestBurst,
		FileStorageMiB:    in.FileStorageMib,
		ModelTokensPerDay: in.ModelTokensPerDay,
	})
	if err != nil {
		return nil, err
	}
	s.Quotas.Forget(id)
	eff := s.Quotas.Apply(o)
	if s.Sandboxes != nil {
		if err := s.Sandboxes.SetSandboxQuota(ctx, id, eff.ConcurrentSandboxes, eff.CPUMillis, eff.MemoryMiB); err != nil {
			return nil, errdefs.Wrap(errdefs.KindOf(err), err, "the overrides are stored, but the fleet refused the sandbox limits")
		}
	}
	return &adminv1.SetQuotaResponse{Effective: quotaPB(eff), Overrides: overridePB(o)}, nil
}

// ListAuditLog pages through the audit log, newest first.
func (s *TenantsService) ListAuditLog(ctx context.Context, req *adminv1.ListAuditLogRequest) (*adminv1.ListAuditLogResponse, error) {
	size := pageSize(req.GetPageSize())
	var (
		recs []store.AuditRecord
		err  error
	)
	if p, ok := auth.From(ctx); ok && !p.Fleet() {
		recs, err = s.Store.Audit().List(tenant.With(ctx, p.Tenant), req.GetBeforeId(), size)
	} else {
		only := tenant.ID(req.GetTenantId())
		if only != "" && only.Validate() != nil {
			return nil, errdefs.NotFound("tenant %s not found", only)
		}
		recs, err = s.Store.Audit().ListAll(ctx, only, req.GetBeforeId(), size)
	}
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListAuditLogResponse{}
	for _, r := range recs {
		out.Records = append(out.Records, &adminv1.AuditRecord{
			Id: r.ID, TenantId: string(r.TenantID), At: timestamppb.New(r.At), Principal: r.Principal,
			Action: r.Action, Resource: r.Resource, Outcome: r.Outcome, RemoteAddr: r.RemoteAddr, RequestId: r.RequestID,
		})
	}
	if len(recs) == int(size) {
		out.NextBeforeId = recs[len(recs)-1].ID
	}
	return out, nil
}

// ListEgressConnections pages through a tenant's egress trail, newest
// first.
func (s *TenantsService) ListEgressConnections(ctx context.Context, req *adminv1.ListEgressConnectionsRequest) (*adminv1.ListEgressConnectionsResponse, error) {
	size := pageSize(req.GetPageSize())
	if len(req.GetSessionId()) > 128 {
		return nil, errdefs.InvalidArgument("session_id is longer than 128 bytes")
	}
	tid, err := listedTenant(ctx, req.GetTenantId(), "the egress trail is kept per tenant")
	if err != nil {
		return nil, err
	}
	recs, err := s.Store.Egress().List(tenant.With(ctx, tid), req.GetSessionId(), req.GetBeforeId(), size)
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListEgressConnectionsResponse{}
	for _, r := range recs {
		out.Connections = append(out.Connections, &adminv1.EgressConnection{
			Id: r.ID, TenantId: string(r.TenantID), SessionId: r.SessionID, HostId: r.HostID,
			Host: r.Host, Port: r.Port, Address: r.Address, Allowed: r.Allowed, Reason: r.Reason,
			BytesUp: r.BytesUp, BytesDown: r.BytesDown, CredentialInjected: r.CredentialInjected,
			StartedAt: timestamppb.New(r.Start), EndedAt: timestamppb.New(r.End),
		})
	}
	if len(recs) == int(size) {
		out.NextBeforeId = recs[len(recs)-1].ID
	}
	return out, nil
}

// ListEnvironmentBuilds lists a tenant's environment package builds,
// newest first.
func (s *TenantsService) ListEnvironmentBuilds(ctx context.Context, req *adminv1.ListEnvironmentBuildsRequest) (*adminv1.ListEnvironmentBuildsResponse, error) {
	size := pageSize(req.GetPageSize())
	if len(req.GetEnvironmentId()) > 128 {
		return nil, errdefs.InvalidArgument("environment_id is longer than 128 bytes")
	}
	tid, err := listedTenant(ctx, req.GetTenantId(), "builds are kept per tenant")
	if err != nil {
		return nil, err
	}
	tctx := tenant.With(ctx, tid)
	out := &adminv1.ListEnvironmentBuildsResponse{}
	var key string
	if id := req.GetEnvironmentId(); id != "" {
		if s.BuildKey == nil {
			return nil, errdefs.FailedPrecondition("this node builds no packages (no --package-mirror)")
		}
		if key, err = s.BuildKey(tctx, id); err != nil {
			return nil, err
		}
		if key == "" {
			return out, nil // no packages: its sessions run their class's image
		}
	}
	builds, err := s.Store.Builds().List(tctx, key, int(size))
	if err != nil {
		return nil, err
	}
	for _, b := range builds {
		eb := &adminv1.EnvironmentBuild{TenantId: string(b.TenantID), Key: b.Key, Image: b.Image, BaseImage: b.BaseImage,
			EnvironmentId: b.EnvironmentID, Status: b.Status, Error: b.Error, Log: b.Log, HostId: b.HostID, Digest: b.Digest,
			LayerBytes: b.LayerBytes, Packages: string(b.Packages), Attempts: int32(b.Attempts), CreatedAt: timestamppb.New(b.CreatedAt)}
		if !b.StartedAt.IsZero() {
			eb.StartedAt = timestamppb.New(b.StartedAt)
		}
		if !b.FinishedAt.IsZero() {
			eb.FinishedAt = timestamppb.New(b.FinishedAt)
		}
		out.Builds = append(out.Builds, eb)
	}
	return out, nil
}

// pageSize is a list request's page size: 100 when unset, at most 1000.
func pageSize(n int32) int32 {
	switch {
	case n <= 0:
		return 100
	case n > 1000:
		return 1000
	}
	return n
}

// listedTenant is the tenant a per-tenant list reads: a tenant's
// principal's own, whatever it asks; the one an operator names, which is
// required (why says why).
func listedTenant(ctx context.Context, asked, why string) (tenant.ID, error) {
	if p, ok := auth.From(ctx); ok && !p.Fleet() {
		return p.Tenant, nil
	}
	tid := tenant.ID(asked)
	switch {
	case tid == "":
		return "", errdefs.InvalidArgument("tenant_id is required: %s", why)
	case tid.Validate() != nil:
		return "", errdefs.NotFound("tenant %s not found", tid)
	}
	return tid, nil
}
