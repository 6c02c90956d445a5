-- Operator keys listed and revoked through the admin API.
--
-- Operator keys stay written by the owner alone (corral admin bootstrap-key):
-- a compromised control plane must not mint operators. But an operator must
-- be able to see them and revoke a leaked one without the owner's password,
-- so the application role gets these two functions, which read every
-- operator key (without its hash) and set one's revoked_at, and nothing
-- more.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION list_operator_keys()
RETURNS TABLE (id text, name text, principal text, roles text[], prefix text,
               created_at timestamptz, revoked_at timestamptz, last_used_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT id, name, principal, roles, prefix, created_at, revoked_at, last_used_at
    FROM operator_keys ORDER BY created_at, id
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION list_operator_keys() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION list_operator_keys() TO corral_app;

-- Revokes operator key key_id (a second revoke keeps the first time) and
-- returns it; no row for an unknown id.
-- +goose StatementBegin
CREATE FUNCTION revoke_operator_key(key_id text)
RETURNS TABLE (id text, name text, principal text, roles text[], prefix text,
               created_at timestamptz, revoked_at timestamptz, last_used_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public AS $$
    UPDATE operator_keys o SET revoked_at = COALESCE(o.revoked_at, now())
    WHERE o.id = key_id
    RETURNING o.id, o.name, o.principal, o.roles, o.prefix, o.created_at, o.revoked_at, o.last_used_at
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION revoke_operator_key(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION revoke_operator_key(text) TO corral_app;

-- +goose Down
DROP FUNCTION revoke_operator_key(text);
DROP FUNCTION list_operator_keys();
