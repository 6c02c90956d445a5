-- What an event keeps for the agent loop alone, never served: the model's
-- blocks it stands for (thinking with its signature, a server tool's use
-- and encrypted result), sent back to the model as written, and a model
-- request's stop reason. NULL for most events.

-- +goose Up
ALTER TABLE events ADD COLUMN private jsonb;

-- +goose Down
ALTER TABLE events DROP COLUMN private;
