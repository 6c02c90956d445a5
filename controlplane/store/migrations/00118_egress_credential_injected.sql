-- An egress connection into whose requests the host's proxy put an
-- environment_variable credential's secret in place of its placeholder
-- (which credential, and the secret, are never recorded).

-- +goose Up
ALTER TABLE egress_connections ADD COLUMN credential_injected boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE egress_connections DROP COLUMN credential_injected;
