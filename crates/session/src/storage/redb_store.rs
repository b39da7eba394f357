//! The default storage: one embedded redb file.
//!
//! Tables: `sessions` (key → record), `deadlines` (key → expiration in
//! milliseconds, only for sessions that have one, so a restart rebuilds the
//! expiry index without decoding records), `quarantine` (records that could
//! not be decoded) and `meta` (the generation counter).
//!
//! After a failed operation the database is closed and opened again before
//! the next one: redb refuses every write after an I/O error ("close and
//! re-open the database"), and a full disk that clears must not leave the
//! engine unable to save until an operator restarts it.

use super::{Storage, StorageError, Write};
use crate::clock::Timestamp;
use estafeta_durable::WriteGate;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard};

const SESSIONS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("sessions");
const DEADLINES: TableDefinition<'_, &[u8], u64> = TableDefinition::new("deadlines");
const QUARANTINE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("quarantine");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");

/// Session storage in a redb database file.
#[derive(Debug)]
pub struct RedbStorage {
    path: PathBuf,
    /// `None` after a failed reopen: the next operation tries again.
    db: RwLock<Option<Database>>,
    generation: u64,
    /// What an online backup closes to hold back this store's writes.
    gate: WriteGate,
}

impl RedbStorage {
    /// Open (or create) the database at `path` and start a new generation.
    /// A file it creates is durable, entry in its folder included, when
    /// this returns.
    pub fn open(path: impl AsRef<Path>) -> Result<RedbStorage, StorageError> {
        RedbStorage::open_gated(path, WriteGate::default())
    }

    /// [`RedbStorage::open`], every write passing `gate` (an online
    /// backup closes it to hold them back).
    pub fn open_gated(
        path: impl AsRef<Path>,
        gate: WriteGate,
    ) -> Result<RedbStorage, StorageError> {
        let path = path.as_ref().to_path_buf();
        let mut generation = 0;
        let db = estafeta_durable::open_redb(&path, |db| {
            let mut tx = db.begin_write()?;
            tx.set_durability(Durability::Immediate)?;
            {
                tx.open_table(SESSIONS)?;
                tx.open_table(DEADLINES)?;
                tx.open_table(QUARANTINE)?;
                let mut meta = tx.open_table(META)?;
                generation = meta.get("generation")?.map(|g| g.value()).unwrap_or(0) + 1;
                meta.insert("generation", generation)?;
            }
            tx.commit()?;
            Ok(())
        })?;
        Ok(RedbStorage {
            path,
            db: RwLock::new(Some(db)),
            generation,
            gate,
        })
    }

    /// Run `op` on the open database; after a failure, close and reopen it
    /// so that the next operation starts clean.
    fn with_db<T>(
        &self,
        op: impl Fn(&Database) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let result = match self.read().as_ref() {
            Some(db) => op(db),
            None => Err(StorageError::Closed),
        };
        if result.is_err() {
            self.reopen();
        }
        result
    }

    fn read(&self) -> RwLockReadGuard<'_, Option<Database>> {
        self.db.read().unwrap_or_else(|p| p.into_inner())
    }

    fn reopen(&self) {
        let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
        // The old handle must be closed before the file can be opened again.
        *db = None;
        match Database::create(&self.path) {
            Ok(fresh) => *db = Some(fresh),
            Err(e) => {
                tracing::error!(error = %e, path = %self.path.display(), "reopening the session database failed")
            }
        }
    }
}

impl Storage for RedbStorage {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.with_db(|db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(SESSIONS)?;
            Ok(table.get(key)?.map(|v| v.value().to_vec()))
        })
    }

    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        self.gate.pass(|| self.with_db(|db| write_batch(db, batch)))
    }

    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError> {
        self.with_db(|db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(DEADLINES)?;
            let mut out = Vec::new();
            for row in table.iter()? {
                let (k, v) = row?;
                out.push((k.value().to_vec(), Timestamp(v.value())));
            }
            Ok(out)
        })
    }

    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
        self.gate.pass(|| self.with_db(|db| quarantine(db, key)))?;
        tracing::warn!(key = %String::from_utf8_lossy(key), reason, "session record quarantined");
        Ok(())
    }

    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        self.with_db(|db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(QUARANTINE)?;
            let mut out = Vec::new();
            for row in table.iter()? {
                out.push(row?.0.value().to_vec());
            }
            Ok(out)
        })
    }

    fn generation(&self) -> u64 {
        self.generation
    }
}

/// Move a record aside, in one durable write transaction.
fn quarantine(db: &Database, key: &[u8]) -> Result<(), StorageError> {
    let mut tx = db.begin_write()?;
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
    Ok(())
}

/// One batch as one durable write transaction.
fn write_batch(db: &Database, batch: &[Write]) -> Result<(), StorageError> {
    let mut tx = db.begin_write()?;
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
    // Named points for the fault-injection harness: a crash before the
    // commit (nothing of the batch is stored) or an injected disk-full
    // error, and a crash after it (stored, but nobody was told).
    fail::fail_point!("session::commit", |_| Err(injected_disk_full()));
    tx.commit()?;
    fail::fail_point!("session::committed");
    Ok(())
}

/// What a `session::commit` failpoint returns: the error of a full disk.
#[cfg(feature = "failpoints")]
fn injected_disk_full() -> StorageError {
    std::io::Error::from(std::io::ErrorKind::StorageFull).into()
}
