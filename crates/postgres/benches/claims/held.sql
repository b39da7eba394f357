-- A claim held by its transaction: due rows locked, handled, removed and
-- committed (durably) in the one transaction; a claimer that dies leaves
-- its rows unlocked and due at once.
BEGIN;
WITH c AS (SELECT e.id FROM unnest(ARRAY['s00','s01','s02','s03','s04','s05','s06','s07','s08','s09','s10','s11','s12','s13','s14','s15']) AS s(source) CROSS JOIN LATERAL (SELECT id FROM repeat_entries WHERE source = s.source AND due <= 1000 ORDER BY due, id LIMIT 16 FOR UPDATE SKIP LOCKED) AS e) SELECT string_agg(id, ',') AS ids FROM c \gset
DELETE FROM repeat_entries WHERE id = ANY(string_to_array(':ids', ','));
COMMIT;
