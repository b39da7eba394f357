//! Idempotency keys of device uploads: one entry per (device, key), each
//! with its own expiry, so that an upload costs the same whether its device
//! has sent ten keyed messages this week or a million.
//!
//! An upload with a key records it here (durably) before its message file
//! is written; a retry with the same key finds it and is answered with the
//! same message id (the file written then if a crash came in between).
//! Entries past their expiry are treated as absent and removed in bounded
//! batches by [`UploadKeys::expire`], oldest first, through an index by
//! expiry time: nothing ever scans all keys.
//!
//! [`RedbKeys`] keeps them in one redb file (the embedded store); puts
//! of concurrent uploads share its durable commits.
//!
//! ```
//! use estafeta_exchange::keys::{KeyedUpload, RedbKeys, UploadKeys};
//! use estafeta_exchange::{Id, Timestamp};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let keys = RedbKeys::open(dir.path().join("keys.redb"))?;
//! let phone: Id = "phone-1".parse()?;
//! let upload = KeyedUpload {
//!     name: "01JD6Y00000000000000000000~phone-1~db-a~sales~1732000000000.json".into(),
//!     at: Timestamp::from_millis(1_000),
//!     expires_at: Timestamp::from_millis(2_000),
//! };
//! keys.put(&phone, "order-17", &upload)?;
//! assert_eq!(keys.get(&phone, "order-17", Timestamp::from_millis(1_500))?, Some(upload));
//! // Past its expiry it is gone, and the sweep removes it.
//! assert_eq!(keys.get(&phone, "order-17", Timestamp::from_millis(2_000))?, None);
//! assert_eq!(keys.expire(Timestamp::from_millis(2_000), 100)?, 1);
//! assert_eq!(keys.len()?, 0);
//! # Ok(())
//! # }
//! ```

use estafeta_durable::WriteGate;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::{Id, Timestamp};

/// (device, key) → the upload (see [`encode`]).
const KEYS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("keys");
/// (expiry in ms, device, key) → (): the sweep's order.
const EXPIRY: TableDefinition<'_, (i64, &str, &str), ()> = TableDefinition::new("keys.expiry");

/// What an idempotency key made: the message's file name, when, and until
/// when the key is remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedUpload {
    /// The message file's name (it carries the id, sender, recipient,
    /// subsystem and creation time).
    pub name: String,
    /// When the upload was accepted.
    pub at: Timestamp,
    /// From this time on the key is forgotten.
    pub expires_at: Timestamp,
}

/// A key store failed.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The underlying database failed (I/O, a full disk, damage).
    #[error("idempotency key store {path}: {source}")]
    Storage {
        /// The store's file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: redb::Error,
    },
    /// A key store other than the embedded one failed (the cluster store's
    /// database, for example).
    #[error("idempotency key store: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A key store other than the embedded one cannot be reached now (its
    /// server down, restarting or handing over): retry later.
    #[error("idempotency key store unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A stored entry cannot be read back (damaged outside the server).
    #[error("idempotency key store {path}: malformed entry for {device}/{key}")]
    Malformed {
        /// The store's file.
        path: PathBuf,
        /// The device.
        device: String,
        /// The key.
        key: String,
    },
}

impl KeysError {
    /// Whether the failure is a full disk (answered `storage_full`).
    pub fn is_storage_full(&self) -> bool {
        match self {
            KeysError::Storage {
                source: redb::Error::Io(e),
                ..
            } => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}

/// Where a device's idempotency keys are kept. Every method is blocking
/// (call it off the async runtime's threads, [`get`](Self::get) excepted
/// where [`reads_in_place`](Self::reads_in_place) says so); each change is
/// durable when it returns `Ok`, and on `Err` nothing changed.
pub trait UploadKeys: Send + Sync + 'static {
    /// The upload `device` made with `key`, unless it is unknown or
    /// expired at `now`.
    fn get(&self, device: &Id, key: &str, now: Timestamp)
    -> Result<Option<KeyedUpload>, KeysError>;
    /// Whether [`get`](Self::get) may run on the async runtime's own
    /// threads: it reads a local file the OS keeps cached, and waits for
    /// no write's sync, no network and no other runtime. Every keyed
    /// upload looks its key up, and a hand-off to a blocking thread and
    /// back is a tenth of such an upload's latency on a small machine.
    fn reads_in_place(&self) -> bool {
        false
    }
    /// Record (or replace) what each key made, all in one durable write
    /// (concurrent uploads can share it).
    fn put_all(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError>;
    /// Record (or replace) what `key` made.
    fn put(&self, device: &Id, key: &str, upload: &KeyedUpload) -> Result<(), KeysError> {
        self.put_all(&[(device.clone(), key.to_owned(), upload.clone())])
    }
    /// Record (or replace) what `key` made as part of `step`, the step a
    /// command holds in a shared session store (see
    /// [`Step::joint`](estafeta_session::storage::Step::joint)), when this
    /// store writes into that store's transactions: the entry is then
    /// written with the step's next save or its end, and exists only once
    /// that succeeded (`true`). `false`: this store cannot; nothing was
    /// done, and [`put`](Self::put) is the way.
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        device: &Id,
        key: &str,
        upload: &KeyedUpload,
    ) -> bool;
    /// Forget every key of `device` (it was deleted: one made again under
    /// its id starts with none); how many there were.
    fn remove_device(&self, device: &Id) -> Result<u64, KeysError>;
    /// Remove up to `max` entries expired at `now`, soonest expired first;
    /// how many were removed.
    fn expire(&self, now: Timestamp, max: usize) -> Result<usize, KeysError>;
    /// How many entries are stored, expired ones not yet swept included.
    fn len(&self) -> Result<u64, KeysError>;
    /// Whether no entry is stored.
    fn is_empty(&self) -> Result<bool, KeysError> {
        Ok(self.len()? == 0)
    }
}

/// [`UploadKeys`] in one redb file; each change is one write transaction
/// committed with redb's default (fsynced) durability. Puts are committed
/// in groups: a put made while another caller's commit is under way waits
/// for it, and the puts that gathered meanwhile then go in one commit,
/// made by one of their callers (no thread of its own, no hand-over when
/// nothing else is under way).
pub struct RedbKeys {
    path: PathBuf,
    db: Database,
    /// The puts waiting for their commit, and the outcomes of the commits
    /// their callers have not all read yet.
    group: Mutex<Group>,
    /// Told when a commit ends.
    committed: Condvar,
    /// What an online backup closes to hold back this store's writes.
    gate: WriteGate,
}

/// The group commit's state (see [`RedbKeys`]).
#[derive(Default)]
struct Group {
    /// The entries of the puts not yet taken into a commit.
    entries: Vec<(Id, String, KeyedUpload)>,
    /// How many callers those entries are from.
    callers: usize,
    /// The number of the commit they go into (one more per commit).
    next: u64,
    /// Whether a caller is committing now.
    committing: bool,
    /// For each commit whose other callers have not all read it: its
    /// outcome (an error as its kind and text) and how many have not.
    outcomes: std::collections::HashMap<u64, (Shared, usize)>,
}

/// A group commit's outcome as its other callers read it: an error as its
/// kind and text.
type Shared = Result<(), (std::io::ErrorKind, String)>;

impl RedbKeys {
    /// Open the store at `path`, creating it (durably, entry in its folder
    /// included) if it does not exist.
    pub fn open(path: impl AsRef<Path>) -> Result<RedbKeys, KeysError> {
        RedbKeys::open_gated(path, WriteGate::default())
    }

    /// [`RedbKeys::open`], every write passing `gate` (an online backup
    /// closes it to hold them back).
    pub fn open_gated(path: impl AsRef<Path>, gate: WriteGate) -> Result<RedbKeys, KeysError> {
        let path = path.as_ref().to_path_buf();
        let db = estafeta_durable::open_redb(&path, |db| {
            let txn = db.begin_write()?;
            txn.open_table(KEYS)?;
            txn.open_table(EXPIRY)?;
            txn.commit()?;
            Ok(())
        })
        .map_err(|source| KeysError::Storage {
            path: path.clone(),
            source,
        })?;
        Ok(RedbKeys {
            path,
            db,
            group: Mutex::default(),
            committed: Condvar::new(),
            gate,
        })
    }

    fn group(&self) -> MutexGuard<'_, Group> {
        self.group.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `entries` in one durable transaction.
    fn commit(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        self.gate.pass(|| self.write(entries))
    }

    fn write(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        let txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        {
            let mut keys = txn.open_table(KEYS).map_err(|e| self.fail(e))?;
            let mut expiry = txn.open_table(EXPIRY).map_err(|e| self.fail(e))?;
            for (device, key, upload) in entries {
                let (device, key) = (device.as_str(), key.as_str());
                let before = keys
                    .insert((device, key), encode(upload).as_slice())
                    .map_err(|e| self.fail(e))?
                    .and_then(|old| decode(old.value()));
                if let Some(old) = before {
                    expiry
                        .remove((old.expires_at.as_millis(), device, key))
                        .map_err(|e| self.fail(e))?;
                }
                expiry
                    .insert((upload.expires_at.as_millis(), device, key), ())
                    .map_err(|e| self.fail(e))?;
            }
        }
        txn.commit().map_err(|e| self.fail(e))
    }

    fn fail(&self, e: impl Into<redb::Error>) -> KeysError {
        KeysError::Storage {
            path: self.path.clone(),
            source: e.into(),
        }
    }
}

/// The stored value: `at` and `expires_at` (ms, big-endian i64) and the
/// file name's bytes.
fn encode(u: &KeyedUpload) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + u.name.len());
    v.extend_from_slice(&u.at.as_millis().to_be_bytes());
    v.extend_from_slice(&u.expires_at.as_millis().to_be_bytes());
    v.extend_from_slice(u.name.as_bytes());
    v
}

fn decode(v: &[u8]) -> Option<KeyedUpload> {
    let (at, rest) = v.split_first_chunk::<8>()?;
    let (expires_at, name) = rest.split_first_chunk::<8>()?;
    Some(KeyedUpload {
        name: std::str::from_utf8(name).ok()?.to_owned(),
        at: Timestamp::from_millis(i64::from_be_bytes(*at)),
        expires_at: Timestamp::from_millis(i64::from_be_bytes(*expires_at)),
    })
}

impl UploadKeys for RedbKeys {
    fn get(
        &self,
        device: &Id,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<KeyedUpload>, KeysError> {
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let table = txn.open_table(KEYS).map_err(|e| self.fail(e))?;
        let Some(value) = table
            .get((device.as_str(), key))
            .map_err(|e| self.fail(e))?
        else {
            return Ok(None);
        };
        let upload = decode(value.value()).ok_or_else(|| KeysError::Malformed {
            path: self.path.clone(),
            device: device.to_string(),
            key: key.to_owned(),
        })?;
        Ok((upload.expires_at > now).then_some(upload))
    }

    /// A read transaction sees the last commit without waiting for a
    /// commit under way (redb's readers never wait for its writer's
    /// fsync), and the file's pages are in the OS's cache.
    fn reads_in_place(&self) -> bool {
        true
    }

    /// Durable when it returns, in a commit shared with the puts that
    /// gathered while the one before it ran (see [`RedbKeys`]); a failed
    /// commit fails every put in it.
    fn put_all(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        let mut group = self.group();
        group.entries.extend_from_slice(entries);
        group.callers += 1;
        let mine = group.next;
        loop {
            if let Some((outcome, unread)) = group.outcomes.get_mut(&mine) {
                *unread -= 1;
                let outcome = outcome.clone();
                if *unread == 0 {
                    group.outcomes.remove(&mine);
                }
                return outcome.map_err(|(kind, text)| {
                    self.fail(redb::Error::Io(std::io::Error::new(kind, text)))
                });
            }
            if !group.committing {
                // Lead: commit every put gathered so far, this one included.
                let entries = std::mem::take(&mut group.entries);
                let others = std::mem::take(&mut group.callers) - 1;
                group.next += 1;
                group.committing = true;
                drop(group);
                let outcome = self.commit(&entries);
                let mut group = self.group();
                group.committing = false;
                if others > 0 {
                    let shared = outcome.as_ref().map(|_| ()).map_err(|e| match e {
                        KeysError::Storage {
                            source: redb::Error::Io(io),
                            ..
                        } => (io.kind(), io.to_string()),
                        other => (std::io::ErrorKind::Other, other.to_string()),
                    });
                    group.outcomes.insert(mine, (shared, others));
                }
                self.committed.notify_all();
                return outcome;
            }
            group = self
                .committed
                .wait(group)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The redb file is not written in a session store's transactions.
    fn put_in_step(
        &self,
        _step: &mut dyn estafeta_session::storage::Step,
        _device: &Id,
        _key: &str,
        _upload: &KeyedUpload,
    ) -> bool {
        false
    }

    fn remove_device(&self, device: &Id) -> Result<u64, KeysError> {
        self.gate.pass(|| self.remove(device))
    }

    fn expire(&self, now: Timestamp, max: usize) -> Result<usize, KeysError> {
        self.gate.pass(|| self.sweep(now, max))
    }

    fn len(&self) -> Result<u64, KeysError> {
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let table = txn.open_table(KEYS).map_err(|e| self.fail(e))?;
        table.len().map_err(|e| self.fail(e))
    }
}

impl RedbKeys {
    /// Removes every key of `device`; how many there were.
    fn remove(&self, device: &Id) -> Result<u64, KeysError> {
        let txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        let mut removed = 0;
        {
            let mut keys = txn.open_table(KEYS).map_err(|e| self.fail(e))?;
            let mut expiry = txn.open_table(EXPIRY).map_err(|e| self.fail(e))?;
            let d = device.as_str();
            // Every (device, key) sorts before (device + NUL, ""): no id
            // holds a NUL.
            let next = format!("{d}\0");
            let gone = keys
                .extract_from_if((d, "")..(next.as_str(), ""), |_, _| true)
                .map_err(|e| self.fail(e))?;
            for entry in gone {
                let (k, v) = entry.map_err(|e| self.fail(e))?;
                let (_, key) = k.value();
                if let Some(old) = decode(v.value()) {
                    expiry
                        .remove((old.expires_at.as_millis(), d, key))
                        .map_err(|e| self.fail(e))?;
                }
                removed += 1;
            }
        }
        txn.commit().map_err(|e| self.fail(e))?;
        Ok(removed)
    }

    /// Removes up to `max` keys expired at `now`; how many.
    fn sweep(&self, now: Timestamp, max: usize) -> Result<usize, KeysError> {
        let txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        let removed;
        {
            let mut keys = txn.open_table(KEYS).map_err(|e| self.fail(e))?;
            let mut expiry = txn.open_table(EXPIRY).map_err(|e| self.fail(e))?;
            let due: Vec<(i64, String, String)> = expiry
                .range(..(now.as_millis().saturating_add(1), "", ""))
                .map_err(|e| self.fail(e))?
                .take(max)
                .map(|entry| {
                    entry.map(|(k, _)| {
                        let (at, device, key) = k.value();
                        (at, device.to_owned(), key.to_owned())
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(|e| self.fail(e))?;
            for (at, device, key) in &due {
                expiry
                    .remove((*at, device.as_str(), key.as_str()))
                    .map_err(|e| self.fail(e))?;
                keys.remove((device.as_str(), key.as_str()))
                    .map_err(|e| self.fail(e))?;
            }
            removed = due.len();
        }
        if removed == 0 {
            txn.abort().map_err(|e| self.fail(e))?;
            return Ok(0);
        }
        txn.commit().map_err(|e| self.fail(e))?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(n: i64, expires: i64) -> KeyedUpload {
        KeyedUpload {
            name: format!("file-{n}.json"),
            at: Timestamp::from_millis(n),
            expires_at: Timestamp::from_millis(expires),
        }
    }

    fn id(s: &str) -> Id {
        s.parse().unwrap()
    }

    /// Puts made while a commit is under way wait for it, then go in one
    /// commit together (made by one of their callers), each durable when
    /// it returns.
    #[test]
    fn puts_gathered_during_a_commit_share_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.redb");
        let keys = std::sync::Arc::new(RedbKeys::open(&path).unwrap());
        // Another caller's commit under way.
        keys.group().committing = true;
        let first = keys.group().next;
        let puts: Vec<_> = (0..8)
            .map(|n| {
                let keys = keys.clone();
                std::thread::spawn(move || keys.put(&id("a"), &format!("k{n}"), &upload(n, 100)))
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while keys.group().callers < 8 {
            assert!(
                std::time::Instant::now() < deadline,
                "the puts never gathered"
            );
            std::thread::yield_now();
        }
        assert!(
            puts.iter().all(|p| !p.is_finished()),
            "they wait for the commit"
        );
        keys.group().committing = false;
        keys.committed.notify_all();
        for put in puts {
            put.join().unwrap().unwrap();
        }
        assert_eq!(keys.group().next, first + 1, "one commit for the eight");
        assert!(keys.group().outcomes.is_empty());
        drop(keys);
        let keys = RedbKeys::open(&path).unwrap();
        for n in 0..8 {
            let found = keys.get(&id("a"), &format!("k{n}"), Timestamp::from_millis(0));
            assert_eq!(found.unwrap(), Some(upload(n, 100)));
        }
    }

    #[test]
    fn keys_are_per_device_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.redb");
        let now = Timestamp::from_millis(5);
        {
            let keys = RedbKeys::open(&path).unwrap();
            keys.put(&id("a"), "k", &upload(1, 100)).unwrap();
            keys.put(&id("b"), "k", &upload(2, 100)).unwrap();
        }
        let keys = RedbKeys::open(&path).unwrap();
        assert_eq!(keys.get(&id("a"), "k", now).unwrap(), Some(upload(1, 100)));
        assert_eq!(keys.get(&id("b"), "k", now).unwrap(), Some(upload(2, 100)));
        assert_eq!(keys.get(&id("a"), "other", now).unwrap(), None);
        keys.put(&id("a"), "k2", &upload(3, 100)).unwrap();
        assert_eq!(keys.remove_device(&id("a")).unwrap(), 2);
        assert_eq!(keys.get(&id("a"), "k", now).unwrap(), None);
        assert_eq!(keys.get(&id("a"), "k2", now).unwrap(), None);
        assert_eq!(keys.len().unwrap(), 1);
        assert_eq!(keys.expire(Timestamp::from_millis(1_000), 10).unwrap(), 1);
    }

    #[test]
    fn the_sweep_takes_expired_entries_in_bounded_batches_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let keys = RedbKeys::open(dir.path().join("keys.redb")).unwrap();
        for n in 0..10 {
            keys.put(&id("a"), &format!("k{n}"), &upload(n, 100 + n))
                .unwrap();
        }
        // Replacing a key moves its expiry: the old one is not swept.
        keys.put(&id("a"), "k0", &upload(0, 1_000)).unwrap();
        let now = Timestamp::from_millis(106);
        assert_eq!(keys.expire(now, 3).unwrap(), 3);
        assert_eq!(keys.get(&id("a"), "k1", now).unwrap(), None);
        assert_eq!(keys.len().unwrap(), 7);
        assert_eq!(keys.expire(now, 100).unwrap(), 3);
        assert_eq!(keys.expire(now, 100).unwrap(), 0);
        assert!(keys.get(&id("a"), "k0", now).unwrap().is_some());
        assert!(keys.get(&id("a"), "k9", now).unwrap().is_some());
        assert_eq!(keys.len().unwrap(), 4);
    }
}
