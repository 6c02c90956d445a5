package server

import (
	"context"
	"sync"
	"time"

	"corral.dev/corral/controlplane/agentloop"
	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/netguard"
)

// tenantModels picks a session's model client: one on its tenant's own
// model_api_key credential, from the first vault of the session's
// vault_ids that holds one, or else the operator's (nil). Clients are
// kept per credential version, a bounded number of them.
type tenantModels struct {
	vaults store.Vaults
	// base is the operator's configuration (timeout, default model, base
	// URL) that a tenant's key runs under; its credentials are replaced.
	base         model.AnthropicConfig
	allowPrivate bool
	// wrap adds what every model client gets (metrics, spans).
	wrap func(model.Client) model.Client
	// facts, when set, spares the credential's read for a session known
	// to name no vault.
	facts *sessionFacts

	mu sync.Mutex
	// clients, guarded by mu, by credential id and update time.
	clients map[string]model.Client
}

var _ agentloop.ModelPicker = (*tenantModels)(nil)

// maxTenantClients bounds the clients kept; past it they are all dropped
// and built again as sessions need them.
const maxTenantClients = 256

// ModelFor implements agentloop.ModelPicker.
func (t *tenantModels) ModelFor(ctx context.Context, sessionID string) (model.Client, error) {
	if t.facts.hasNoVaults(sessionID) {
		return nil, nil
	}
	sc, ok, vaults, err := t.vaults.ModelCredentialFor(ctx, sessionID)
	if err == nil && !vaults {
		t.facts.setNoVaults(sessionID)
	}
	if err != nil || !ok {
		return nil, err
	}
	key := sc.ID + "@" + sc.UpdatedAt.UTC().Format(time.RFC3339Nano)
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.clients[key]; ok {
		return c, nil
	}
	cfg := t.base
	cfg.APIKey, cfg.AuthToken = sc.Secrets.Token, ""
	if u := sc.ModelBaseURL; u != nil {
		// The tenant's own endpoint: checked again (the policy may have
		// changed since the credential was stored), and dialled only
		// outside the operator's network unless private networks are
		// allowed.
		if err := model.CheckBaseURL(*u, t.allowPrivate); err != nil {
			return nil, errdefs.FailedPrecondition("model_api_key credential %s: base_url %v", sc.ID, err)
		}
		cfg.BaseURL, cfg.Transport = *u, netguard.Transport(t.allowPrivate, "model APIs")
	}
	c, err := model.NewAnthropic(cfg)
	if err != nil {
		return nil, errdefs.FailedPrecondition("model_api_key credential %s: %v", sc.ID, err)
	}
	if len(t.clients) >= maxTenantClients {
		clear(t.clients)
	}
	if t.clients == nil {
		t.clients = map[string]model.Client{}
	}
	t.clients[key] = t.wrap(c)
	return t.clients[key], nil
}
