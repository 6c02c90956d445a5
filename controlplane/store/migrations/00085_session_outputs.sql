-- A session's outputs (files its agent wrote under /mnt/session/outputs,
-- published to the Files API when the session goes idle) carry the
-- SHA-256 of their content, so that publishing again keeps a file whose
-- path and content are unchanged and replaces one whose content changed.
-- Uploads leave it NULL.

-- +goose Up
ALTER TABLE files ADD COLUMN sha256 text CHECK (sha256 ~ '^[0-9a-f]{64}$');

-- +goose Down
ALTER TABLE files DROP COLUMN sha256;
