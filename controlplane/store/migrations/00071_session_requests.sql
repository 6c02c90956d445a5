-- What made each session: the create request's idempotency key, when the
-- caller sent one, and a digest of its principal and body. A create that
-- repeats a key gets the session the key made (a different request under
-- the same key is refused); an SDK's automatic retry of a create without a
-- key gets the session a matching request made shortly before. A key
-- lives as long as its session.

-- +goose Up
CREATE TABLE session_requests (
    tenant_id       text        NOT NULL,
    session_id      text        NOT NULL,
    idempotency_key text        CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_sha256  bytea       NOT NULL CHECK (length(request_sha256) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

CREATE UNIQUE INDEX session_requests_key ON session_requests (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX session_requests_recent ON session_requests (tenant_id, request_sha256, created_at);

ALTER TABLE session_requests ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_requests FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON session_requests
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT SELECT, INSERT, DELETE ON session_requests TO corral_app;

-- +goose Down
DROP TABLE session_requests;
