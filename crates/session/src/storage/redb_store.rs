//! The default storage: one embedded redb file.
//!
//! Tables: `sessions` (key → record), `deadlines` (key → expiration in
//! milliseconds, only for sessions that have one, so a restart rebuilds the
//! expiry index without decoding records), `quarantine` (records that could
//! not be decoded) and `meta` (the generation counter).

use super::{Storage, StorageError, Write};
use crate::clock::Timestamp;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;

const SESSIONS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("sessions");
const DEADLINES: TableDefinition<'_, &[u8], u64> = TableDefinition::new("deadlines");
const QUARANTINE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("quarantine");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");

/// Session storage in a redb database file.
#[derive(Debug)]
pub struct RedbStorage {
    db: Database,
    generation: u64,
}

impl RedbStorage {
    /// Open (or create) the database at `path` and start a new generation.
    pub fn open(path: impl AsRef<Path>) -> Result<RedbStorage, StorageError> {
        let db = Database::create(path)?;
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        let generation;
        {
            tx.open_table(SESSIONS)?;
            tx.open_table(DEADLINES)?;
            tx.open_table(QUARANTINE)?;
            let mut meta = tx.open_table(META)?;
            generation = meta.get("generation")?.map(|g| g.value()).unwrap_or(0) + 1;
            meta.insert("generation", generation)?;
        }
        tx.commit()?;
        Ok(RedbStorage { db, generation })
    }
}

impl Storage for RedbStorage {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(SESSIONS)?;
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }

    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        {
            let mut sessions = tx.open_table(SESSIONS)?;
            let mut deadlines = tx.open_table(DEADLINES)?;
            for w in batch {
                match w {
                    Write::Put {
                        key,
                        record,
                        expires_at,
                    } => {
                        sessions.insert(key.as_slice(), record.as_slice())?;
                        match expires_at {
                            Some(t) => deadlines.insert(key.as_slice(), t.0)?,
                            None => deadlines.remove(key.as_slice())?,
                        };
                    }
                    Write::Delete { key } => {
                        sessions.remove(key.as_slice())?;
                        deadlines.remove(key.as_slice())?;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(DEADLINES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            out.push((k.value().to_vec(), Timestamp(v.value())));
        }
        Ok(out)
    }

    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        {
            let mut sessions = tx.open_table(SESSIONS)?;
            let mut deadlines = tx.open_table(DEADLINES)?;
            let mut quarantine = tx.open_table(QUARANTINE)?;
            let record = sessions.remove(key)?.map(|v| v.value().to_vec());
            deadlines.remove(key)?;
            if let Some(record) = record {
                quarantine.insert(key, record.as_slice())?;
            }
        }
        tx.commit()?;
        tracing::warn!(key = %String::from_utf8_lossy(key), reason, "session record quarantined");
        Ok(())
    }

    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(QUARANTINE)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            out.push(row?.0.value().to_vec());
        }
        Ok(out)
    }

    fn generation(&self) -> u64 {
        self.generation
    }
}
