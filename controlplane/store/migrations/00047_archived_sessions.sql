-- archived_sessions(ids) returns which of the given session ids name an
-- archived session, in any tenant, and when each was archived. The fleet's
-- sweep calls it to release the sandboxes of sessions archived longer than
-- the retention (runtimes.yaml archive_release_after_seconds). SECURITY
-- DEFINER, as existing_sessions (00030): the application role learns of
-- the ids it gave and nothing else of any tenant's rows.

-- +goose Up
CREATE FUNCTION archived_sessions(ids text[]) RETURNS TABLE (session_id text, archived_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT s.id, s.archived_at FROM sessions s WHERE s.id = ANY(ids) AND s.archived_at IS NOT NULL
$$;
REVOKE ALL ON FUNCTION archived_sessions(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION archived_sessions(text[]) TO corral_app;

-- +goose Down
DROP FUNCTION archived_sessions(text[]);
