-- A session's sandbox class (policy/classes.yaml), fixed when the session
-- is created: its environment's corral.sandbox_class, or its tenant's
-- default then. Every placement of its sandbox asks for the class's
-- provider. Empty in a session created before classes existed: it gets
-- its tenant's default class when it is placed.

-- +goose Up
ALTER TABLE sessions ADD COLUMN sandbox_class text NOT NULL DEFAULT '' CHECK (length(sandbox_class) <= 63);

-- +goose Down
ALTER TABLE sessions DROP COLUMN sandbox_class;
