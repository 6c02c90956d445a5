-- Per-tenant model token quotas: the override of the default quota's
-- model_tokens_per_day, and each tenant's tokens (input and output of its
-- sessions' model requests) by UTC day, added in the transaction that
-- appends the request's events. A tenant past its day's tokens gets 429s
-- naming the quota, and its turns end before their next model request.

-- +goose Up
ALTER TABLE tenant_quotas ADD COLUMN model_tokens_per_day bigint CHECK (model_tokens_per_day > 0);

CREATE TABLE tenant_token_usage (
    tenant_id text   NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    day       date   NOT NULL,
    tokens    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);
ALTER TABLE tenant_token_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_token_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_token_usage
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));
GRANT SELECT, INSERT, UPDATE ON tenant_token_usage TO corral_app;

-- +goose Down
DROP TABLE tenant_token_usage;
ALTER TABLE tenant_quotas DROP COLUMN model_tokens_per_day;
