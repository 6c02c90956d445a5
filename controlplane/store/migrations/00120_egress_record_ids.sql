-- An egress record's id, unique among its host's records: a host keeps a
-- record until the control plane has acknowledged the heartbeat that
-- carried it, and sends it again after a lost ack, so the same record can
-- arrive twice; it is stored once per host and id. Rows from before ids
-- (and from hosts that send none) have '' and are not deduplicated.

-- +goose Up
ALTER TABLE egress_connections ADD COLUMN record_id text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX egress_connections_once ON egress_connections (host_id, record_id) WHERE record_id <> '';

-- +goose Down
DROP INDEX egress_connections_once;
ALTER TABLE egress_connections DROP COLUMN record_id;
