-- The cluster store: every piece of state of every node, in one PostgreSQL
-- database. Times are milliseconds since the Unix epoch (bigint), taken from
-- the clock of the node that writes them. Every hot query below names the
-- index that serves it; none scans a table.

-- Settings of the whole cluster, one row each (for example the hash of the
-- admin token made at the first start). Read at start, rarely written.
CREATE TABLE cluster_settings (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);

-- Counters of the whole cluster: `generation` grows with every node start
-- (a session record saved under an older generation was saved before it).
CREATE TABLE cluster_counters (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO cluster_counters (name, value) VALUES ('generation', 0);

-- Tenancy: enterprises and their subsystems (mobile apps).
CREATE TABLE enterprises (
    id         text PRIMARY KEY,
    created_at bigint NOT NULL
);

CREATE TABLE subsystems (
    enterprise_id text NOT NULL REFERENCES enterprises (id),
    id            text NOT NULL,
    created_at    bigint NOT NULL,
    PRIMARY KEY (enterprise_id, id)
);

-- Databases and devices: one table because their ids share one namespace
-- (a message names its sender and recipient by id alone). A device belongs
-- to one subsystem of its enterprise; a database to none. Only the token's
-- hash is kept; the unique index on it turns every authentication into one
-- index lookup, and a token changed or revoked here is refused by every node
-- at its next call.
CREATE TABLE mailboxes (
    id            text PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('database', 'device')),
    enterprise_id text NOT NULL REFERENCES enterprises (id),
    subsystem_id  text,
    token_hash    bytea NOT NULL UNIQUE,
    -- A device's push address (webhook), if it gave one.
    push_url      text,
    created_at    bigint NOT NULL,
    CHECK ((kind = 'device') = (subsystem_id IS NOT NULL)),
    FOREIGN KEY (enterprise_id, subsystem_id) REFERENCES subsystems (enterprise_id, id)
);

-- Every message, body included, and its place: `owner` is the mailbox
-- whose folder holds it and `place` the folder. A message is in one place
-- at a time (its id is the key), so a move is an `UPDATE` of `owner` and
-- `place`, and a second delivery of one message (two nodes dispatching the
-- same due entry) finds the first. No reference to `mailboxes`: the
-- message store and the registry are separate stores, and a mailbox's
-- messages are removed by the store when the registry removes it.
CREATE TABLE messages (
    id          text COLLATE "C" PRIMARY KEY,
    owner       text NOT NULL,
    place       text NOT NULL
                CHECK (place IN ('Messages', 'Prepared', 'Log', 'Unknown', 'Error')),
    sender      text NOT NULL,
    recipient   text NOT NULL,
    subsystem   text NOT NULL,
    -- The sender's creation time: folders list oldest first by it, then by
    -- id (a ULID: arrival order).
    created_at  bigint NOT NULL,
    -- The body's size in bytes, kept so that `start` sums sizes from the
    -- index without reading bodies.
    size        bigint NOT NULL,
    -- The message as handed out (JSON bytes, exactly as stored).
    body        bytea NOT NULL
);
-- A folder in listing order: `start` reads the first rows of
-- (database, 'Messages'), a device's inbox the first rows of
-- (device, 'Messages'), the dashboard any folder, each one index range scan
-- that stops after its limit whatever the folder's size. The columns of a
-- message's name and its size are included, so that `start` picks its
-- messages and applies the megabyte limit from the index alone.
CREATE INDEX messages_folder ON messages (owner, place, created_at, id)
    INCLUDE (size, sender, recipient, subsystem);

-- Entries of the repeat scheduler (estafeta-repeat's store): messages kept
-- aside until their `deliver_at` (source `deliver_at`, the message's bytes
-- as the payload) and any other source. Ids are unique across sources.
-- Read in (source, due, id) order; `due` is a wall-clock second.
CREATE TABLE repeat_entries (
    id      text COLLATE "C" PRIMARY KEY,
    source  text NOT NULL,
    due     bigint NOT NULL,
    attempt integer NOT NULL,
    payload bytea NOT NULL
);
CREATE INDEX repeat_entries_due ON repeat_entries (source, due, id);

-- Every source that holds or held entries: a node's scheduler reads them
-- when it starts. The exchange's `deliver_at` source is there from the
-- start, so that every node reads it even before any node scheduled a
-- message.
CREATE TABLE repeat_sources (
    name text PRIMARY KEY
);
INSERT INTO repeat_sources (name) VALUES ('deliver_at');

-- Processes (the six-call protocol), cluster-wide: any node continues a
-- process another node started. `deadline` is the STARTED or READY_TO_COMMIT
-- timeout (NULL once the process ended), claimed by the first node that polls
-- past it. Ended processes stay for the retention period (`ended_at`).
CREATE TABLE processes (
    id          text PRIMARY KEY,
    db_id       text NOT NULL REFERENCES mailboxes (id),
    state       text NOT NULL CHECK (state IN ('STARTED', 'READY_TO_COMMIT', 'CLEANUP', 'FAILED',
                                               'DONE', 'ROLLED_BACK', 'ABORTED', 'TIMED_OUT', 'IN_DOUBT')),
    started_at  bigint NOT NULL,
    updated_at  bigint NOT NULL,
    deadline    bigint,
    ended_at    bigint,
    -- The next automatic retry of a FAILED commit's moves.
    retry_at    bigint,
    retries     integer NOT NULL DEFAULT 0,
    error_text  text
);
-- One live process per database: a second `start` fails on this index
-- (answered BUSY) instead of relying on a check in code.
CREATE UNIQUE INDEX processes_live ON processes (db_id)
    WHERE state IN ('STARTED', 'READY_TO_COMMIT', 'CLEANUP', 'FAILED');
CREATE INDEX processes_deadline ON processes (deadline) WHERE deadline IS NOT NULL;
CREATE INDEX processes_retry ON processes (retry_at) WHERE retry_at IS NOT NULL;
CREATE INDEX processes_ended ON processes (ended_at) WHERE ended_at IS NOT NULL;

-- The messages a process handed out, which of them were accepted, and the
-- verdict `prepare` gave each: `commit` and doubt move them by verdict.
CREATE TABLE process_messages (
    process_id text NOT NULL REFERENCES processes (id) ON DELETE CASCADE,
    message_id text NOT NULL REFERENCES messages (id),
    accepted   boolean NOT NULL DEFAULT true,
    verdict    text CHECK (verdict IN ('PROCESSED', 'PROCESSED_DEADLOCK', 'PROCESSED_INCORRECT')),
    error_code bigint,
    error_text text,
    PRIMARY KEY (process_id, message_id)
);

-- Idempotency keys of uploads: one row per (device, key) with the upload
-- it made (the message's file name), so two nodes receiving the same
-- upload at once both write one row, and the later write replaces the
-- earlier as a second write on one node would. Expired rows are swept by
-- `expires_at`, oldest first.
CREATE TABLE idempotency_keys (
    device_id  text NOT NULL,
    key        text NOT NULL,
    name       text NOT NULL,
    at         bigint NOT NULL,
    expires_at bigint NOT NULL,
    PRIMARY KEY (device_id, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at, device_id, key);

-- Alerts to the administrator (a process in doubt, a failed commit), raised
-- once per event by the transaction that found the event.
CREATE TABLE alerts (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text NOT NULL,
    db_id      text,
    process_id text,
    text       text NOT NULL,
    raised_at  bigint NOT NULL
);
CREATE INDEX alerts_raised ON alerts (raised_at);

-- Each alert's deliveries (one per channel and address) still to be sent,
-- with their next attempt: claimed when due by one node, deleted in the
-- transaction that records the sending, or moved to a later attempt.
CREATE TABLE alert_deliveries (
    alert_id     bigint NOT NULL REFERENCES alerts (id) ON DELETE CASCADE,
    channel      text NOT NULL,
    address      text NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    next_attempt bigint NOT NULL,
    last_error   text,
    PRIMARY KEY (alert_id, channel, address)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt);

-- Push notifications still to be sent (a device or database has new
-- messages), at most one row per recipient: a new message for a recipient
-- whose notification is pending changes nothing.
CREATE TABLE push_backlog (
    recipient    text PRIMARY KEY REFERENCES mailboxes (id),
    url          text NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    next_attempt bigint NOT NULL,
    last_error   text
);
CREATE INDEX push_backlog_due ON push_backlog (next_attempt);

-- Statistics: one counter per (mailbox, name), added to by the step that
-- counts (the mailbox's step holds its lock, so counters do not contend).
CREATE TABLE statistics (
    mailbox_id text NOT NULL REFERENCES mailboxes (id),
    name       text NOT NULL,
    value      bigint NOT NULL,
    PRIMARY KEY (mailbox_id, name)
);

-- The event log (dashboard, rollback and abort texts): append only, read
-- newest first, whole or per database.
CREATE TABLE events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         bigint NOT NULL,
    db_id      text,
    process_id text,
    kind       text NOT NULL,
    text       text NOT NULL
);
CREATE INDEX events_db ON events (db_id, id) WHERE db_id IS NOT NULL;
CREATE INDEX events_at ON events (at);

-- Dashboard login sessions, by the hash of the cookie's secret.
CREATE TABLE dashboard_sessions (
    secret_hash bytea PRIMARY KEY,
    created_at  bigint NOT NULL,
    expires_at  bigint NOT NULL
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

-- The session engine's records (estafeta-session's storage): one row per
-- session key, also the row whose lock makes a key's steps exclusive across
-- nodes (`SELECT … FOR UPDATE` for the length of one step's transaction). A
-- row with no record is only a lock. `expires_at` is the session's deadline,
-- claimed when due by one node.
CREATE TABLE sessions (
    key         bytea PRIMARY KEY,
    record      bytea,
    expires_at  bigint,
    -- The `cluster_counters.generation` of the node that saved the record.
    generation  bigint NOT NULL DEFAULT 0
);
CREATE INDEX sessions_expiry ON sessions (expires_at) WHERE expires_at IS NOT NULL;

-- Session records that could not be decoded, moved aside so that they
-- neither block their key nor are lost.
CREATE TABLE quarantined_sessions (
    key    bytea PRIMARY KEY,
    record bytea,
    reason text NOT NULL
);
