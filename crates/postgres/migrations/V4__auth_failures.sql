-- Wrong tokens (bearer tokens and dashboard logins) by client address,
-- shared by every node, so that an address one node makes wait waits on
-- all of them. A node counts in memory and reports what it counted now and
-- then, in one transaction: never a statement per wrong token.
-- `client` is the address (an IPv6 client by its /64), `failures` its
-- wrong tokens in a row, `last_at` the time of the last one (the database
-- server's clock, milliseconds since the epoch). `version` rises with each
-- change, so that a node reads only the rows changed since it last looked.
CREATE SEQUENCE auth_failures_version;
CREATE TABLE auth_failures (
    client   inet PRIMARY KEY,
    failures integer NOT NULL,
    last_at  bigint NOT NULL,
    version  bigint NOT NULL
);
CREATE INDEX auth_failures_by_version ON auth_failures (version);
CREATE INDEX auth_failures_by_last_at ON auth_failures (last_at);
