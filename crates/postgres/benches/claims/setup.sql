-- The dispatch bench's table: 900,000 entries due later, 500,000 due at second
-- 1000, over 16 sources; run before each claim script.
DROP TABLE IF EXISTS repeat_entries;
CREATE TABLE repeat_entries (id text COLLATE "C" PRIMARY KEY, source text NOT NULL, due bigint NOT NULL, attempt integer NOT NULL, payload bytea NOT NULL);
CREATE INDEX repeat_entries_due ON repeat_entries (source, due, id);
INSERT INTO repeat_entries SELECT 'later-'||i, 's'||lpad((i%16)::text,2,'0'), 1000000000 + i % 86400, 0, '\x00000000000000000000000000000000'::bytea FROM generate_series(0, 899999) i;
INSERT INTO repeat_entries SELECT 'due-'||i, 's'||lpad((i%16)::text,2,'0'), 1000, 0, '\x00000000000000000000000000000000'::bytea FROM generate_series(0, 499999) i;
VACUUM ANALYZE repeat_entries;
CHECKPOINT;
