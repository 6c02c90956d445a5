-- existing_sessions(ids) returns which of the given session ids exist, in
-- any tenant. The fleet's sweep calls it to find sandbox placements whose
-- session was deleted (a node that crashed between deleting a session and
-- releasing its placement leaves one behind). SECURITY DEFINER so the
-- application role can ask without seeing any tenant's rows; it returns
-- only ids it was given. The owner reads every tenant's sessions through
-- the runner_scan policy (00011).

-- +goose Up
CREATE FUNCTION existing_sessions(ids text[]) RETURNS TABLE (session_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT s.id FROM sessions s WHERE s.id = ANY(ids)
$$;
REVOKE ALL ON FUNCTION existing_sessions(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION existing_sessions(text[]) TO corral_app;

-- +goose Down
DROP FUNCTION existing_sessions(text[]);
