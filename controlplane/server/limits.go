package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/api/publicapi"
	"corral.dev/corral/controlplane/quota"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/policy"
)

// modelLimits are the loop's Limits, and the check before a user.message
// is stored: the tenant's model token quota (model_tokens_per_day), and
// the session's budget (its tokens at the policy's list prices).
type modelLimits struct {
	quotas   *quota.Quotas
	store    *store.Store
	listCost publicapi.ListCostFunc
	// facts, when set, spares the session's read for a session known to
	// have no budget.
	facts *sessionFacts
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
//
// A session whose list cost has reached its budget (or whose model has no
// list price any more, which the budget cannot measure) ends its turn with
// stop_reason budget_reached, as the API does.
func (l modelLimits) BeforeModelRequest(ctx context.Context, sessionID string) (*agentloop.Stop, error) {
	err := l.checkTokens(ctx)
	var spent *tokenQuotaError
	if errors.As(err, &spent) {
		return &agentloop.Stop{
			Reason: agentloop.StopReason{Type: "end_turn"},
			Error:  &agentloop.ErrorInfo{Type: "model_rate_limited_error", Message: agentloop.TenantMessage(err), RetryStatus: "exhausted"},
		}, nil
	}
	if err != nil || l.facts.hasNoBudget(sessionID) {
		return nil, err
	}
	s, err := l.store.Sessions().Get(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	if len(s.VaultIDs) == 0 {
		l.facts.setNoVaults(sessionID)
	}
	if s.BudgetCents == nil {
		l.facts.setNoBudget(sessionID)
		return nil, nil
	}
	var agent struct {
		Model struct {
			ID string `json:"id"`
		} `json:"model"`
	}
	_ = json.Unmarshal(s.Agent, &agent)
	cost, priced := l.listCost(agent.Model.ID, s.Usage)
	if priced && cost < *s.BudgetCents*10_000_000 {
		return nil, nil
	}
	return &agentloop.Stop{Reason: agentloop.StopReason{Type: "budget_reached"}}, nil
}

// listCost prices usage on model at prices (nanodollars); cache writes
// count at the 5-minute rate, the only lifetime the loop asks for.
func listCost(prices map[string]policy.ModelPrice) publicapi.ListCostFunc {
	return func(model string, u store.SessionUsage) (int64, bool) {
		p, ok := prices[model]
		if !ok {
			return 0, false
		}
		return p.CostNanos(u.InputTokens, u.OutputTokens, u.CacheCreation5mInputTokens+u.CacheCreation1hInputTokens, u.CacheReadInputTokens), true
	}
}
