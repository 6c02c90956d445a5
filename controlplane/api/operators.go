package api

import (
	"context"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// OperatorKeysService implements corral.admin.v1.OperatorKeysService. The
// gRPC interceptor lets only fleet principals with the operator_keys
// actions through.
type OperatorKeysService struct {
	adminv1.UnimplementedOperatorKeysServiceServer

	Store *store.Store
	Authn *auth.Authenticator
}

var _ adminv1.OperatorKeysServiceServer = (*OperatorKeysService)(nil)

// ListOperatorKeys lists every operator key.
func (s *OperatorKeysService) ListOperatorKeys(ctx context.Context, _ *adminv1.ListOperatorKeysRequest) (*adminv1.ListOperatorKeysResponse, error) {
	keys, err := s.Store.OperatorKeys().List(ctx)
	if err != nil {
		return nil, err
	}
	out := &adminv1.ListOperatorKeysResponse{}
	for _, k := range keys {
		out.ApiKeys = append(out.ApiKeys, apiKeyPB(k))
	}
	return out, nil
}

// RevokeOperatorKey revokes an operator key; this node refuses it at once,
// others within seconds (auth's key cache).
func (s *OperatorKeysService) RevokeOperatorKey(ctx context.Context, req *adminv1.RevokeOperatorKeyRequest) (*adminv1.RevokeOperatorKeyResponse, error) {
	if req.GetKeyId() == "" {
		return nil, errdefs.InvalidArgument("key_id is required")
	}
	if p, ok := auth.From(ctx); ok && p.KeyID == req.GetKeyId() {
		return nil, errdefs.FailedPrecondition("operator key %s cannot revoke itself; use another operator's key", p.KeyID)
	}
	k, err := s.Store.OperatorKeys().Revoke(ctx, req.GetKeyId())
	if err != nil {
		return nil, err
	}
	s.Authn.Forget()
	return &adminv1.RevokeOperatorKeyResponse{ApiKey: apiKeyPB(k)}, nil
}
