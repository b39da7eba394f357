-- The state a node of the embedded store keeps under its data folder
-- (alerts and their deliveries, the push backlog, dashboard logins), shared
-- by every node of the cluster. Alert deliveries and pending push
-- notifications are entries of the repeat scheduler (`repeat_entries`,
-- sources `alerts` and `push`), claimed when due by one node for a lease;
-- the dedicated tables of V1 are replaced. Statistics are kept with each
-- database's and device's session record (`sessions`), written by the
-- step that counts, so V1's `statistics` table goes too.

DROP TABLE statistics;
DROP TABLE alert_deliveries;
DROP TABLE alerts;
DROP TABLE push_backlog;
DROP TABLE dashboard_sessions;

-- Alerts to the administrators, one row per raised alert: `key` names its
-- condition (`in_doubt:<process>`), unique among ongoing alerts, so that two
-- nodes seeing one event record one alert, and the same transaction writes
-- its deliveries. `ended_at` is set when the condition ended, `acked_at`
-- when an operator acknowledged the alert on the dashboard.
CREATE TABLE alerts (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key      text NOT NULL,
    -- The alert as raised (JSON).
    alert    bytea NOT NULL,
    ended_at bigint,
    acked_at bigint
);
CREATE UNIQUE INDEX alerts_ongoing ON alerts (key) WHERE ended_at IS NULL;
CREATE INDEX alerts_unacknowledged ON alerts (id) WHERE acked_at IS NULL;

-- Dashboard login sessions, by the hash of the cookie's secret, so that a
-- login through one node holds on every node. `expires_at` moves with each
-- use (the session's idle timeout), in the database server's clock.
CREATE TABLE dashboard_sessions (
    secret_hash bytea PRIMARY KEY,
    csrf        text NOT NULL,
    expires_at  bigint NOT NULL
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

-- The event log (protocol steps, alerts, warnings and errors of every
-- node), newest first, whole or for one database, device, process,
-- message or request. The key is the record's id (nanoseconds, sequence),
-- each stored as a bigint with its top bit flipped so that the order of
-- the unsigned values is kept; `size` is the record's JSON length, summed
-- in `cluster_counters` (`event_bytes`) for the retention by size.
DROP TABLE events;
CREATE TABLE events (
    nanos    bigint NOT NULL,
    seq      bigint NOT NULL,
    db       text,
    device   text,
    process  text,
    message  text,
    request  text,
    size     bigint NOT NULL,
    record   bytea NOT NULL,
    PRIMARY KEY (nanos, seq)
);
CREATE INDEX events_db ON events (db, nanos, seq) WHERE db IS NOT NULL;
CREATE INDEX events_device ON events (device, nanos, seq) WHERE device IS NOT NULL;
CREATE INDEX events_process ON events (process, nanos, seq) WHERE process IS NOT NULL;
CREATE INDEX events_message ON events (message, nanos, seq) WHERE message IS NOT NULL;
CREATE INDEX events_request ON events (request, nanos, seq) WHERE request IS NOT NULL;
INSERT INTO cluster_counters (name, value) VALUES ('event_bytes', 0);
