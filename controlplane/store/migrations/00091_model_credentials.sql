-- A tenant's own model access, kept in its vaults: a model_api_key
-- credential (a corral extension of the Managed Agents credential types)
-- holds an API key, encrypted as every credential secret is, and an
-- optional base URL. A session that names the vault in vault_ids runs its
-- model requests with that key instead of the operator's. Such a
-- credential has no MCP server: its mcp_server_url is empty and its
-- match_url a fixed name, so that a vault holds at most one active one.

-- +goose Up
ALTER TABLE vault_credentials DROP CONSTRAINT vault_credentials_auth_type_check;
ALTER TABLE vault_credentials ADD CONSTRAINT vault_credentials_auth_type_check
    CHECK (auth_type IN ('static_bearer', 'mcp_oauth', 'model_api_key'));
ALTER TABLE vault_credentials ADD COLUMN model_base_url text;

-- +goose Down
DELETE FROM vault_credentials WHERE auth_type = 'model_api_key';
ALTER TABLE vault_credentials DROP COLUMN model_base_url;
ALTER TABLE vault_credentials DROP CONSTRAINT vault_credentials_auth_type_check;
ALTER TABLE vault_credentials ADD CONSTRAINT vault_credentials_auth_type_check
    CHECK (auth_type IN ('static_bearer', 'mcp_oauth'));
