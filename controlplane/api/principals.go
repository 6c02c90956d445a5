package api

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// tenantRoles refuses any role that is not a tenant role of the policy: a
// tenant's principals never hold fleet roles.
func (s *TenantsService) tenantRoles(roles []string) error {
	for _, r := range roles {
		scope, ok := s.Policy.HasRole(r)
		if !ok || scope != policy.TenantScope {
			return errdefs.InvalidArgument("role %q is not a tenant role of policy/roles.yaml", r)
		}
	}
	return nil
}

func principalPB(p store.Principal) *adminv1.Principal {
	pb := &adminv1.Principal{
		Id: p.ID, TenantId: string(p.TenantID), Kind: p.Kind, Name: p.Name,
		Issuer: p.Issuer, Subject: p.Subject, Roles: p.Roles, CreatedAt: timestamppb.New(p.CreatedAt),
	}
	if p.DisabledAt != nil {
		pb.DisabledAt = timestamppb.New(*p.DisabledAt)
	}
	if p.LastSeenAt != nil {
		pb.LastSeenAt = timestamppb.New(*p.LastSeenAt)
	}
	return pb
}

// CreatePrincipal adds a service principal, or a user ahead of its first
// token.
func (s *TenantsService) CreatePrincipal(ctx context.Context, req *adminv1.CreatePrincipalRequest) (*adminv1.CreatePrincipalResponse, error) {
	if err := s.tenantRoles(req.GetRoles()); err != nil {
		return nil, err
	}
	if req.GetKind() == store.PrincipalUser && !s.Authn.Trusts(req.GetIssuer()) {
		return nil, errdefs.InvalidArgument("issuer %q is not one this server trusts (--oidc-config)", req.GetIssuer())
	}
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	p, err := s.Store.Principals().Create(tctx, store.NewPrincipal{
		Kind: req.GetKind(), Name: req.GetName(), Issuer: req.GetIssuer(), Subject: req.GetSubject(), Roles: req.GetRoles(),
	})
	if err != nil {
		return nil, err
	}
	// A user seen before its record was made cannot be: its record was made
	// then. Forget anyway, so that nothing cached outlives this change.
	s.Authn.Forget()
	return &adminv1.CreatePrincipalResponse{Principal: principalPB(p)}, nil
}

// ListPrincipals lists the tenant's principals.
func (s *TenantsService) ListPrincipals(ctx context.Context, req *adminv1.ListPrincipalsRequest) (*adminv1.ListPrincipalsResponse, error) {
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	ps, err := s.Store.Principals().List(tctx)
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListPrincipalsResponse{}
	for _, p := range ps {
		out.Principals = append(out.Principals, principalPB(p))
	}
	return out, nil
}

// GetPrincipal describes one principal.
func (s *TenantsService) GetPrincipal(ctx context.Context, req *adminv1.GetPrincipalRequest) (*adminv1.GetPrincipalResponse, error) {
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	p, err := s.Store.Principals().Get(tctx, req.GetPrincipalId())
	if err != nil {
		return nil, err
	}
	return &adminv1.GetPrincipalResponse{Principal: principalPB(p)}, nil
}

// SetPrincipalRoles replaces a principal's roles; this node applies them at
// once, others within seconds (auth's caches).
func (s *TenantsService) SetPrincipalRoles(ctx context.Context, req *adminv1.SetPrincipalRolesRequest) (*adminv1.SetPrincipalRolesResponse, error) {
	if err := s.tenantRoles(req.GetRoles()); err != nil {
		return nil, err
	}
	tctx, _, err := s.inTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	p, err := s.Store.Principals().SetRoles(tctx, req.GetPrincipalId(), req.GetRoles())
	if err != nil {
		return nil, err
	}
	s.Authn.Forget()
	return &adminv1.SetPrincipalRolesResponse{Principal: principalPB(p)}, nil
}

// DisablePrincipal refuses the principal's keys and tokens.
func (s *TenantsService) DisablePrincipal(ctx context.Context, req *adminv1.DisablePrincipalRequest) (*adminv1.DisablePrincipalResponse, error) {
	if caller, ok := auth.From(ctx); ok && caller.PrincipalID != "" && caller.PrincipalID == req.GetPrincipalId() {
		return nil, errdefs.FailedPrecondition("principal %s cannot disable itself", caller.PrincipalID)
	}
	p, err := s.setDisabled(ctx, req.GetTenantId(), req.GetPrincipalId(), true)
	if err != nil {
		return nil, err
	}
	return &adminv1.DisablePrincipalResponse{Principal: principalPB(p)}, nil
}

// EnablePrincipal lifts a DisablePrincipal.
func (s *TenantsService) EnablePrincipal(ctx context.Context, req *adminv1.EnablePrincipalRequest) (*adminv1.EnablePrincipalResponse, error) {
	p, err := s.setDisabled(ctx, req.GetTenantId(), req.GetPrincipalId(), false)
	if err != nil {
		return nil, err
	}
	return &adminv1.EnablePrincipalResponse{Principal: principalPB(p)}, nil
}

func (s *TenantsService) setDisabled(ctx context.Context, requested, id string, disabled bool) (store.Principal, error) {
	tctx, _, err := s.inTenant(ctx, requested)
	if err != nil {
		return store.Principal{}, err
	}
	p, err := s.Store.Principals().SetDisabled(tctx, id, disabled)
	if err != nil {
		return store.Principal{}, err
	}
	s.Authn.Forget()
	return p, nil
}
