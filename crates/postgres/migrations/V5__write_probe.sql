-- One row that every node updates to learn whether the database takes
-- writes now (its `/readyz`): the update's commit fails on a standby,
-- under `default_transaction_read_only`, and when the server cannot write
-- its write-ahead log.
CREATE TABLE write_probe (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    writes   bigint NOT NULL
);
INSERT INTO write_probe (writes) VALUES (0);
