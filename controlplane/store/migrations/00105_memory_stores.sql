-- Memory stores (the Managed Agents shapes): a tenant's stores, their
-- memories (UTF-8 text documents addressed by path) and every memory's
-- versions, one per write.
--
-- A memory's content lives in its row (at most 100 kB, the API's limit);
-- each version keeps the content as written, until it is redacted
-- (content, path, size and sha256 set NULL; the record stays). The
-- memory's current version is memory_version_id; a deleted memory's row
-- goes, its versions (the last one a "deleted") stay until the store
-- goes. Paths order byte-wise (COLLATE "C"), so listing and paging by
-- path is the same on every server.

-- +goose Up
CREATE TABLE memory_stores (
    tenant_id   text        NOT NULL REFERENCES tenants (id),
    id          text        NOT NULL,
    name        text        NOT NULL,
    description text        NOT NULL DEFAULT '',
    metadata    jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    archived_at timestamptz,
    PRIMARY KEY (tenant_id, id)
);

CREATE INDEX memory_stores_newest ON memory_stores (tenant_id, created_at DESC, id DESC);

CREATE TABLE memories (
    tenant_id         text        NOT NULL,
    store_id          text        NOT NULL,
    id                text        NOT NULL,
    path              text        COLLATE "C" NOT NULL,
    content           text        NOT NULL,
    content_sha256    text        NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes        bigint      NOT NULL CHECK (size_bytes >= 0),
    memory_version_id text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, store_id, path),
    FOREIGN KEY (tenant_id, store_id) REFERENCES memory_stores (tenant_id, id) ON DELETE CASCADE
);

CREATE TABLE memory_versions (
    tenant_id      text        NOT NULL,
    store_id       text        NOT NULL,
    id             text        NOT NULL,
    memory_id      text        NOT NULL,
    operation      text        NOT NULL CHECK (operation IN ('created', 'modified', 'deleted')),
    -- NULL once redacted (and content, size and sha256 for a deleted).
    path           text        COLLATE "C",
    content        text,
    content_sha256 text        CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes     bigint,
    -- Who wrote it: api_actor (an API key's id), user_actor (a
    -- principal's id) or session_actor (a session's id).
    actor_type     text        NOT NULL CHECK (actor_type IN ('api_actor', 'user_actor', 'service_account_actor', 'session_actor')),
    actor_id       text        NOT NULL,
    -- The wall clock, not the transaction's start: the versions one
    -- commit writes keep their order.
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    redacted_at    timestamptz,
    redactor_type  text,
    redactor_id    text,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, store_id) REFERENCES memory_stores (tenant_id, id) ON DELETE CASCADE
);

CREATE INDEX memory_versions_newest ON memory_versions (tenant_id, store_id, created_at DESC, id DESC);

ALTER TABLE memory_stores ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_stores FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_stores
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memories
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE memory_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_versions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_versions
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT SELECT, INSERT, UPDATE, DELETE ON memory_stores, memories, memory_versions TO corral_app;

-- +goose Down
DROP TABLE memory_versions;
DROP TABLE memories;
DROP TABLE memory_stores;
