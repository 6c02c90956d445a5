-- Files (the Files API): a tenant's uploads, and later a session's outputs;
-- and a tenant's override of its file storage quota.
--
-- The row is the file's metadata; its bytes are in the blob store under
-- blob_key (files/<tenant>/<file id>). A file exists for readers once its
-- row does: an upload stores the blob first and inserts the row after, and
-- a delete removes the row first and the blob after.

-- +goose Up
CREATE TABLE files (
    tenant_id    text        NOT NULL REFERENCES tenants (id),
    id           text        NOT NULL,
    filename     text        NOT NULL,
    mime_type    text        NOT NULL,
    size_bytes   bigint      NOT NULL CHECK (size_bytes >= 0),
    -- Whether the content may be downloaded (the API's downloadable).
    downloadable boolean     NOT NULL,
    -- The session a file belongs to (its outputs); NULL for uploads.
    scope_id     text,
    blob_key     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);

CREATE INDEX files_newest ON files (tenant_id, created_at DESC, id DESC);
CREATE INDEX files_scope ON files (tenant_id, scope_id, created_at DESC, id DESC) WHERE scope_id IS NOT NULL;

ALTER TABLE files ENABLE ROW LEVEL SECURITY;
ALTER TABLE files FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON files
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT SELECT, INSERT, DELETE ON files TO corral_app;

-- A tenant's own bound on its files' bytes (NULL: the policy's
-- file_storage_mib).
ALTER TABLE tenant_quotas ADD COLUMN file_storage_mib integer CHECK (file_storage_mib > 0);

-- +goose Down
ALTER TABLE tenant_quotas DROP COLUMN file_storage_mib;
DROP TABLE files;
