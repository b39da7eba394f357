-- Every mailbox the message store holds messages for, made with the
-- database or device and removed with it. A message and a message kept
-- aside for a mailbox reference its row, so that removing the row removes
-- them in the same transaction, and a write for a mailbox being removed
-- either commits before the removal (which then removes it too: the
-- reference's lock orders the two) or fails: nothing lands under a deleted
-- id, and a mailbox made again under it starts empty.
CREATE TABLE message_owners (
    id text PRIMARY KEY
);
INSERT INTO message_owners (id) SELECT id FROM mailboxes;
-- Messages of mailboxes deleted before this schema kept them apart.
DELETE FROM messages WHERE owner NOT IN (SELECT id FROM message_owners);
ALTER TABLE messages ADD CONSTRAINT messages_owner
    FOREIGN KEY (owner) REFERENCES message_owners (id) ON DELETE CASCADE;

-- The recipient of a message kept aside until its `deliver_at` (source
-- `deliver_at`); NULL for entries of other sources.
ALTER TABLE repeat_entries ADD COLUMN owner text;
UPDATE repeat_entries SET owner = convert_from(payload, 'UTF8')::jsonb ->> 'to'
    WHERE source = 'deliver_at';
DELETE FROM repeat_entries
    WHERE owner IS NOT NULL AND owner NOT IN (SELECT id FROM message_owners);
ALTER TABLE repeat_entries ADD CONSTRAINT repeat_entries_owner
    FOREIGN KEY (owner) REFERENCES message_owners (id) ON DELETE CASCADE;
CREATE INDEX repeat_entries_owner ON repeat_entries (owner) WHERE owner IS NOT NULL;

-- The tables V1 made for processes were never used: a process lives in its
-- database's session record, and which database owns it and how it ended
-- in a session record of its own, written by the database's step.
DROP TABLE process_messages;
DROP TABLE processes;
