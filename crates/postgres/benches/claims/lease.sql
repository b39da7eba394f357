-- The claiming queue as it is: due rows locked and moved a lease ahead in one
-- transaction (its commit not waiting for the flush), their removal a
-- durable transaction of its own once handled.
BEGIN;
SET LOCAL synchronous_commit = off;
WITH c AS (SELECT e.id FROM unnest(ARRAY['s00','s01','s02','s03','s04','s05','s06','s07','s08','s09','s10','s11','s12','s13','s14','s15']) AS s(source) CROSS JOIN LATERAL (SELECT id FROM repeat_entries WHERE source = s.source AND due <= 1000 ORDER BY due, id LIMIT 16 FOR UPDATE SKIP LOCKED) AS e), u AS (UPDATE repeat_entries r SET due = 2000000000 FROM c WHERE r.id = c.id RETURNING r.id) SELECT string_agg(id, ',') AS ids FROM u \gset
COMMIT;
DELETE FROM repeat_entries WHERE id = ANY(string_to_array(':ids', ','));
