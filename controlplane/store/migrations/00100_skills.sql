-- Skills (the Skills API): a tenant's custom skills and their versions.
--
-- A skill is a name (its immutable slug, from the first version's SKILL.md)
-- and a display name; each version is an uploaded bundle, kept in the blob
-- store under skills/<tenant>/<skill id>/<version id>/: the whole as a zip
-- archive (blob_key, what a download returns) and each file on its own
-- (files/<n>, the n-th of the files column, what a sandbox is given). As
-- with files, the blobs are stored before the row is inserted and deleted
-- after the row is.
--
-- latest_version_id is the newest version; a skill always has one (the
-- last version cannot be deleted, only the skill with it).

-- +goose Up
CREATE TABLE skills (
    tenant_id         text        NOT NULL REFERENCES tenants (id),
    id                text        NOT NULL,
    name              text        NOT NULL,
    display_name      text        NOT NULL,
    latest_version_id text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);

CREATE INDEX skills_newest ON skills (tenant_id, created_at DESC, id DESC);

CREATE TABLE skill_versions (
    tenant_id   text        NOT NULL,
    skill_id    text        NOT NULL,
    id          text        NOT NULL,
    name        text        NOT NULL,
    description text        NOT NULL,
    size_bytes  bigint      NOT NULL CHECK (size_bytes >= 0),
    file_count  integer     NOT NULL CHECK (file_count > 0),
    blob_key    text        NOT NULL,
    -- The bundle's files: [{"path": "SKILL.md", "size": 12}, ...].
    files       jsonb       NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, skill_id, id),
    FOREIGN KEY (tenant_id, skill_id) REFERENCES skills (tenant_id, id) ON DELETE CASCADE
);

CREATE INDEX skill_versions_newest ON skill_versions (tenant_id, skill_id, created_at DESC, id DESC);

ALTER TABLE skills ENABLE ROW LEVEL SECURITY;
ALTER TABLE skills FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON skills
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

ALTER TABLE skill_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE skill_versions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON skill_versions
    USING (tenant_id = current_setting('corral.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('corral.tenant_id', true));

GRANT SELECT, INSERT, UPDATE, DELETE ON skills TO corral_app;
GRANT SELECT, INSERT, DELETE ON skill_versions TO corral_app;

-- +goose Down
DROP TABLE skill_versions;
DROP TABLE skills;
