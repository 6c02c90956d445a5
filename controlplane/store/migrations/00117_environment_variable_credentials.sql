-- environment_variable credentials: a secret that a session's sandbox
-- holds only as a placeholder in the environment variable secret_name;
-- the host's egress proxy puts the secret in its place in the header
-- values of requests to the credential's allowed_hosts. The secret is
-- stored as every credential secret is (encrypted under the tenant's data
-- key). match_url is a fixed name with the variable's name in it, so that
-- a vault holds one active credential per variable.
--
-- sessions.egress_seed: 32 random bytes, made at a session's first tool
-- call with such credentials; each credential's placeholder is derived
-- from it and the credential's id (never from the secret), so that every
-- control-plane node gives the session's sandbox the same placeholders.

-- +goose Up
ALTER TABLE vault_credentials DROP CONSTRAINT vault_credentials_auth_type_check;
ALTER TABLE vault_credentials ADD CONSTRAINT vault_credentials_auth_type_check
    CHECK (auth_type IN ('static_bearer', 'mcp_oauth', 'model_api_key', 'environment_variable'));
ALTER TABLE vault_credentials ADD COLUMN secret_name text;
ALTER TABLE vault_credentials ADD COLUMN allowed_hosts jsonb;
ALTER TABLE vault_credentials ADD CONSTRAINT vault_credentials_environment_variable_check
    CHECK ((auth_type = 'environment_variable') = (secret_name IS NOT NULL AND allowed_hosts IS NOT NULL));
ALTER TABLE sessions ADD COLUMN egress_seed bytea;

-- +goose Down
ALTER TABLE sessions DROP COLUMN egress_seed;
DELETE FROM vault_credentials WHERE auth_type = 'environment_variable';
ALTER TABLE vault_credentials DROP CONSTRAINT vault_credentials_environment_variable_check;
ALTER TABLE vault_credentials DROP COLUMN allowed_hosts;
ALTER TABLE vault_credentials DROP COLUMN secret_name;
ALTER TABLE vault_credentials DROP CONSTRAINT vault_credentials_auth_type_check;
ALTER TABLE vault_credentials ADD CONSTRAINT vault_credentials_auth_type_check
    CHECK (auth_type IN ('static_bearer', 'mcp_oauth', 'model_api_key'));
