package server

import (
	"context"
	"errors"
	"fmt"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
)

// modelLimits are the loop's Limits, and the check before a user.message
// is stored: the tenant's model token quota (model_tokens_per_day).
type modelLimits struct {
	quotas *quota.Quotas
	store  *store.Store
}

var _ agentloop.Limits = modelLimits{}

// tokenQuotaError is a spent model token quota. Its kind is resource
// exhausted (HTTP 429); its message names the quota.
type tokenQuotaError struct{ msg string }

func (e *tokenQuotaError) Error() string { return e.msg }
func (e *tokenQuotaError) Unwrap() error { return errdefs.ResourceExhausted("%s", e.msg) }

// checkTokens refuses (resource exhausted, HTTP 429, naming the quota) when
// the tenant in ctx has used its model tokens of the day.
func (l modelLimits) checkTokens(ctx context.Context) error {
	id, err := tenant.Required(ctx)
	if err != nil {
		return err
	}
	q, err := l.quotas.Effective(ctx, id)
	if err != nil || q.ModelTokensPerDay <= 0 {
		return err
	}
	used, err := l.store.Quotas().TokensToday(ctx)
	if err != nil {
		return err
	}
	if used < q.ModelTokensPerDay {
		return nil
	}
	return &tokenQuotaError{fmt.Sprintf("tenant %s: quota model_tokens_per_day exceeded (%d tokens used today, limit %d); it resets at 00:00 UTC", id, used, q.ModelTokensPerDay)}
}

// BeforeModelRequest implements agentloop.Limits: a turn whose tenant has
// spent its tokens ends before its next request, with a session.error
// that names the quota.
func (l modelLimits) BeforeModelRequest(ctx context.Context, _ string) (*agentloop.Stop, error) {
	err := l.checkTokens(ctx)
	var spent *tokenQuotaError
	if !errors.As(err, &spent) {
		return nil, err
	}
	return &agentloop.Stop{
		Reason: agentloop.StopReason{Type: "end_turn"},
		Error:  &agentloop.ErrorInfo{Type: "model_rate_limited_error", Message: agentloop.TenantMessage(err), RetryStatus: "exhausted"},
	}, nil
}
