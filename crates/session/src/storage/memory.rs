//! In-memory storage for tests and for sessions that need no durability.

use super::{Storage, StorageError, Write};
use crate::clock::Timestamp;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Storage in a map in memory. It can be told to fail writes, which is how
/// tests reproduce a full disk.
#[derive(Debug, Default)]
pub struct MemoryStorage {
    data: Mutex<Tables>,
    fail_writes: AtomicBool,
    batches: AtomicU64,
}

#[derive(Debug, Default)]
struct Tables {
    records: BTreeMap<Vec<u8>, (Vec<u8>, Option<Timestamp>)>,
    quarantine: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl MemoryStorage {
    /// Empty storage.
    pub fn new() -> MemoryStorage {
        MemoryStorage::default()
    }

    /// While `on`, every write fails with [`StorageError::Injected`] and
    /// changes nothing.
    pub fn fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::SeqCst);
    }

    /// How many write batches were applied (each one stands for one fsync
    /// in a durable store).
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::SeqCst)
    }

    /// Store raw bytes under a key, bypassing the engine: lets tests plant a
    /// record that cannot be decoded.
    pub fn put_raw(&self, key: &[u8], record: &[u8]) {
        self.tables()
            .records
            .insert(key.to_vec(), (record.to_vec(), None));
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic elsewhere while holding the lock leaves the maps intact.
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Storage for MemoryStorage {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.tables().records.get(key).map(|(r, _)| r.clone()))
    }

    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(StorageError::Injected);
        }
        let mut t = self.tables();
        for w in batch {
            match w {
                Write::Put {
                    key,
                    record,
                    expires_at,
                } => {
                    t.records.insert(key.clone(), (record.clone(), *expires_at));
                }
                Write::Delete { key } => {
                    t.records.remove(key);
                }
            }
        }
        self.batches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError> {
        Ok(self
            .tables()
            .records
            .iter()
            .filter_map(|(k, (_, e))| e.map(|e| (k.clone(), e)))
            .collect())
    }

    fn quarantine(&self, key: &[u8], _reason: &str) -> Result<(), StorageError> {
        let mut t = self.tables();
        if let Some((r, _)) = t.records.remove(key) {
            t.quarantine.insert(key.to_vec(), r);
        }
        Ok(())
    }

    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        Ok(self.tables().quarantine.keys().cloned().collect())
    }

    fn generation(&self) -> u64 {
        0
    }
}
