//! The default storage: one embedded redb file, and a save log before it.
//!
//! Tables: `sessions` (key → record), `deadlines` (key → expiration in
//! milliseconds, only for sessions that have one, so a restart rebuilds the
//! expiry index without decoding records), `quarantine` (records that could
//! not be decoded) and `meta` (the generation counter, and the last epoch
//! of the save log folded into the tables).
//!
//! A batch of writes is made durable by the save log (`save_log.rs`,
//! beside the database as `<file>.log`): one append and one `fdatasync`,
//! where a redb commit would rewrite every page the batch touches. Its
//! writes are kept in memory, newest per key, and read before the tables
//! (`unfolded`); when the log is full, they are folded into the tables in
//! one durable commit, which also records the log's epoch as folded. Opening
//! folds what the log holds of the epoch after the recorded one.
//!
//! After a failed operation the database is closed and opened again before
//! the next one: redb refuses every write after an I/O error ("close and
//! re-open the database"), and a full disk that clears must not leave the
//! engine unable to save until an operator restarts it. After a failed
//! append, the log takes no frame before a fold (the failed one may be
//! partly written, and a frame after it would be unreadable behind it).

use super::save_log::{self, AppendError, SaveLog};
use super::{Storage, StorageError, Write};
use crate::clock::Timestamp;
use estafeta_durable::WriteGate;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

const SESSIONS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("sessions");
const DEADLINES: TableDefinition<'_, &[u8], u64> = TableDefinition::new("deadlines");
const QUARANTINE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("quarantine");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// The meta row of the last save log epoch folded into the tables.
const FOLDED: &str = "folded";
/// The meta row of the salt of this database's save log.
const LOG: &str = "log";
/// How large the save log grows before its writes are folded.
const LOG_LIMIT: u64 = 8 * 1024 * 1024;

/// Session storage in a redb database file.
#[derive(Debug)]
pub struct RedbStorage {
    path: PathBuf,
    /// `None` after a failed reopen: the next operation tries again.
    db: RwLock<Option<Database>>,
    generation: u64,
    /// What an online backup closes to hold back this store's writes.
    gate: WriteGate,
    /// The save log; its lock orders appends and folds.
    log: Mutex<Logged>,
    /// The log's writes not folded yet, newest per key: read before the
    /// tables. Changed only under `log`'s lock.
    unfolded: RwLock<HashMap<Vec<u8>, Write>>,
}

/// What the next opening of a session database does with the save log
/// beside it ([`RedbStorage::inspect_save_log`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SaveLogState {
    /// There is none, and the database records none (it is new): one is
    /// made.
    Absent,
    /// The database's own log: the `batches` saved since the last fold
    /// are folded into the tables.
    Own {
        /// Batches of writes in the log, not in the tables yet.
        batches: usize,
    },
    /// A file the database does not record as its log (another
    /// database's, or one left beside a database moved aside): it is
    /// replaced and none of it is replayed.
    Foreign,
    /// The database records a log and there is none: whatever was saved
    /// since the last fold is lost (a clean stop keeps the log); a new one
    /// is made.
    Missing,
}

/// The save log and whether it must be folded before its next frame.
#[derive(Debug)]
struct Logged {
    log: SaveLog,
    /// An append failed: its frame may be partly written.
    broken: bool,
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
        RedbStorage::open_limited(path.as_ref(), gate, LOG_LIMIT)
    }

    /// [`RedbStorage::open_gated`] with a save log of at most `log_limit`
    /// bytes.
    fn open_limited(
        path: &Path,
        gate: WriteGate,
        log_limit: u64,
    ) -> Result<RedbStorage, StorageError> {
        let path = path.to_path_buf();
        let mut generation = 0;
        let mut folded = 0;
        let mut logged = None;
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
                folded = meta.get(FOLDED)?.map_or(0, |e| e.value());
                logged = meta.get(LOG)?.map(|salt| salt.value());
            }
            tx.commit()?;
            Ok(())
        })?;
        let log_path = save_log::path_of(&path);
        // The log recorded in the database is opened; any other (none is
        // recorded: the database is new, or was moved aside for an empty
        // one) is replaced by a new log, recorded before its first frame,
        // and none of its frames is replayed.
        let ours = match logged {
            Some(salt) => {
                Some(SaveLog::open(&log_path, folded + 1, log_limit).map_err(StorageError::from)?)
                    .filter(|(log, _)| log.salt() == salt)
            }
            None => None,
        };
        let log = match ours {
            Some((mut log, batches)) => {
                if !batches.is_empty() {
                    let writes: Vec<Write> = batches.into_iter().flatten().collect();
                    write_batch(&db, &writes, Some(log.epoch()))?;
                    log.folded();
                }
                log
            }
            None => {
                if log_path.try_exists().map_err(StorageError::from)? {
                    tracing::warn!(path = %log_path.display(), "the session save log is not this database's; replaced");
                }
                let log = SaveLog::create_new(&log_path, folded + 1, log_limit)
                    .map_err(StorageError::from)?;
                record_log(&db, log.salt())?;
                log
            }
        };
        Ok(RedbStorage {
            path,
            db: RwLock::new(Some(db)),
            generation,
            gate,
            log: Mutex::new(Logged { log, broken: false }),
            unfolded: RwLock::default(),
        })
    }

    /// Where the save log of the database at `path` is: beside it, its
    /// name with `.log` added.
    pub fn save_log_path(path: &Path) -> PathBuf {
        save_log::path_of(path)
    }

    /// What the save log beside the database at `path`, open as `db` (not
    /// by a storage), holds for the next opening, read without changing
    /// either file. An error when the log cannot be read or is not a save
    /// log: the opening would stop on it too.
    pub fn inspect_save_log(db: &Database, path: &Path) -> Result<SaveLogState, StorageError> {
        let txn = db.begin_read()?;
        let (folded, recorded) = match txn.open_table(META) {
            Ok(meta) => (
                meta.get(FOLDED)?.map_or(0, |e| e.value()),
                meta.get(LOG)?.map(|salt| salt.value()),
            ),
            Err(redb::TableError::TableDoesNotExist(_)) => (0, None),
            Err(e) => return Err(e.into()),
        };
        let log = save_log::path_of(path);
        let Some(recorded) = recorded else {
            return Ok(if log.try_exists()? {
                SaveLogState::Foreign
            } else {
                SaveLogState::Absent
            });
        };
        Ok(match save_log::inspect(&log, folded + 1)? {
            None => SaveLogState::Missing,
            Some((salt, batches)) if salt == recorded => SaveLogState::Own { batches },
            Some(_) => SaveLogState::Foreign,
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

    fn logged(&self) -> MutexGuard<'_, Logged> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Folds the log's writes into the tables in one durable commit that
    /// records its epoch as folded; the log starts over in the next epoch.
    /// Nothing changes if the commit fails.
    fn fold(&self, logged: &mut Logged) -> Result<(), StorageError> {
        if logged.log.is_empty() && !logged.broken {
            return Ok(());
        }
        let writes: Vec<Write> = self.unfolded_read().values().cloned().collect();
        let epoch = logged.log.epoch();
        self.with_db(|db| write_batch(db, &writes, Some(epoch)))?;
        self.unfolded
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        logged.log.folded();
        logged.broken = false;
        Ok(())
    }

    fn unfolded_read(&self) -> RwLockReadGuard<'_, HashMap<Vec<u8>, Write>> {
        self.unfolded.read().unwrap_or_else(|p| p.into_inner())
    }

    /// `batch` made durable through the log (folding first when it is
    /// full or broken), or, larger than the whole log, by a commit of its
    /// own after a fold.
    fn save(&self, batch: &[Write]) -> Result<(), StorageError> {
        let mut logged = self.logged();
        if logged.broken {
            self.fold(&mut logged)?;
        }
        // Named points for the fault-injection harness: a crash before the
        // append (nothing of the batch is stored) or an injected disk-full
        // error, and a crash after it (stored, but nobody was told).
        fail::fail_point!("session::commit", |_| Err(injected_disk_full()));
        let appended = match logged.log.append(batch) {
            Err(AppendError::Full) => {
                self.fold(&mut logged)?;
                logged.log.append(batch)
            }
            appended => appended,
        };
        match appended {
            Ok(()) => {}
            Err(AppendError::Full) => {
                self.with_db(|db| write_batch(db, batch, None))?;
                fail::fail_point!("session::committed");
                return Ok(());
            }
            Err(AppendError::Io(e)) => {
                logged.broken = true;
                return Err(e.into());
            }
        }
        fail::fail_point!("session::committed");
        let mut unfolded = self.unfolded.write().unwrap_or_else(|p| p.into_inner());
        for w in batch {
            unfolded.insert(w.key().to_vec(), w.clone());
        }
        Ok(())
    }
}

impl Drop for RedbStorage {
    /// What the log holds is folded at a clean close, so that the database
    /// file alone holds every record (as a copy or a check reads it); if
    /// that fails, the next opening folds it.
    fn drop(&mut self) {
        let mut logged = self.logged();
        let _ = self.gate.pass(|| self.fold(&mut logged));
    }
}

impl Storage for RedbStorage {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self.unfolded_read().get(key) {
            Some(Write::Put { record, .. }) => return Ok(Some(record.clone())),
            Some(Write::Delete { .. }) => return Ok(None),
            None => {}
        }
        self.with_db(|db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(SESSIONS)?;
            Ok(table.get(key)?.map(|v| v.value().to_vec()))
        })
    }

    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        self.gate.pass(|| self.save(batch))
    }

    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError> {
        self.with_db(|db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(DEADLINES)?;
            let mut stored = HashMap::new();
            for row in table.iter()? {
                let (k, v) = row?;
                stored.insert(k.value().to_vec(), Timestamp(v.value()));
            }
            Ok(stored)
        })
        .map(|mut stored| {
            for (key, w) in self.unfolded_read().iter() {
                match w {
                    Write::Put {
                        expires_at: Some(at),
                        ..
                    } => stored.insert(key.clone(), *at),
                    _ => stored.remove(key),
                };
            }
            stored.into_iter().collect()
        })
    }

    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
        self.gate.pass(|| {
            let mut logged = self.logged();
            self.fold(&mut logged)?;
            self.with_db(|db| quarantine(db, key))
        })?;
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

/// Records `salt` as that of this database's save log, durably.
fn record_log(db: &Database, salt: u64) -> Result<(), StorageError> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)?;
    tx.open_table(META)?.insert(LOG, salt)?;
    tx.commit()?;
    Ok(())
}

/// One batch as one durable write transaction; `folded`: the save log's
/// epoch it completes, recorded in the same commit.
fn write_batch(db: &Database, batch: &[Write], folded: Option<u64>) -> Result<(), StorageError> {
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
    if let Some(epoch) = folded {
        tx.open_table(META)?.insert(FOLDED, epoch)?;
    }
    tx.commit()?;
    Ok(())
}

/// What a `session::commit` failpoint returns: the error of a full disk.
#[cfg(feature = "failpoints")]
fn injected_disk_full() -> StorageError {
    std::io::Error::from(std::io::ErrorKind::StorageFull).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, record: &[u8], at: Option<u64>) -> Write {
        Write::Put {
            key: key.into(),
            record: record.to_vec(),
            expires_at: at.map(Timestamp),
        }
    }

    /// The files of the storage at `from`, copied to `to` while it stays
    /// open: what a crash now would leave of what was acknowledged.
    fn crash_copy(from: &Path, to: &Path) {
        std::fs::copy(from, to).unwrap();
        std::fs::copy(save_log::path_of(from), save_log::path_of(to)).unwrap();
    }

    fn folded_epoch(path: &Path) -> u64 {
        let db = Database::create(path).unwrap();
        let tx = db.begin_read().unwrap();
        let meta = tx.open_table(META).unwrap();
        meta.get(FOLDED).unwrap().map_or(0, |e| e.value())
    }

    #[test]
    fn saves_in_the_log_are_read_first_and_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let storage = RedbStorage::open(&path).unwrap();
        storage
            .write(&[put("a", b"1", Some(10)), put("b", b"2", None)])
            .unwrap();
        storage
            .write(&[
                put("a", b"3", Some(20)),
                Write::Delete { key: b"b".to_vec() },
            ])
            .unwrap();
        storage.write(&[put("c", b"4", Some(30))]).unwrap();
        storage.write(&[put("c", b"5", None)]).unwrap();
        let check = |storage: &RedbStorage| {
            assert_eq!(storage.load(b"a").unwrap(), Some(b"3".to_vec()));
            assert_eq!(storage.load(b"b").unwrap(), None);
            assert_eq!(storage.load(b"c").unwrap(), Some(b"5".to_vec()));
            assert_eq!(
                storage.deadlines().unwrap(),
                vec![(b"a".to_vec(), Timestamp(20))]
            );
        };
        check(&storage);
        // Nothing of it is in the tables yet: the log holds it all.
        assert!(!storage.logged().log.is_empty());
        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed);
        drop(storage);
        // Opening folds the log's epoch into the tables.
        let reopened = RedbStorage::open(&crashed).unwrap();
        check(&reopened);
        assert!(reopened.logged().log.is_empty());
        drop(reopened);
        assert_eq!(folded_epoch(&crashed), 1);
        // A clean close folds too.
        check(&RedbStorage::open(&path).unwrap());
        assert_eq!(folded_epoch(&path), 1);
    }

    #[test]
    fn a_full_log_is_folded_and_a_batch_larger_than_it_committed_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let limit = 256 * 1024;
        let storage = RedbStorage::open_limited(&path, WriteGate::default(), limit).unwrap();
        let record = |i: usize| vec![i as u8; 10_000];
        for i in 0..100 {
            storage
                .write(&[put(&format!("k{}", i % 7), &record(i), Some(i as u64))])
                .unwrap();
        }
        let epoch = storage.logged().log.epoch();
        assert!(epoch > 2, "the log was folded more than once ({epoch})");
        storage
            .write(&[put("huge", &vec![7; limit as usize], None)])
            .unwrap();
        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed);
        for storage in [storage, RedbStorage::open(&crashed).unwrap()] {
            for k in 0..7 {
                let last = (93..100).find(|i| i % 7 == k).unwrap();
                let key = format!("k{k}");
                assert_eq!(storage.load(key.as_bytes()).unwrap(), Some(record(last)));
            }
            assert_eq!(
                storage.load(b"huge").unwrap().map(|r| r.len()),
                Some(limit as usize)
            );
            assert_eq!(storage.deadlines().unwrap().len(), 7);
        }
    }

    #[test]
    fn a_log_left_beside_a_database_moved_aside_is_not_replayed_into_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let storage = RedbStorage::open(&path).unwrap();
        storage.write(&[put("a", b"old", None)]).unwrap();
        // A crash, then the operator moves the database aside to start
        // with it empty; its log stays.
        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed);
        drop(storage);
        std::fs::rename(&crashed, dir.path().join("aside.redb")).unwrap();
        let fresh = RedbStorage::open(&crashed).unwrap();
        assert_eq!(fresh.load(b"a").unwrap(), None);
        fresh.write(&[put("b", b"new", None)]).unwrap();
        let again = dir.path().join("again.redb");
        crash_copy(&crashed, &again);
        drop(fresh);
        let reopened = RedbStorage::open(&again).unwrap();
        assert_eq!(reopened.load(b"a").unwrap(), None);
        assert_eq!(reopened.load(b"b").unwrap(), Some(b"new".to_vec()));
    }

    /// What a check reads of the log is what the next opening does with
    /// it, and reading it changes neither file.
    #[test]
    fn the_save_log_is_inspected_as_the_next_opening_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let inspect = |path: &Path| {
            let db = Database::create(path).unwrap();
            RedbStorage::inspect_save_log(&db, path)
        };
        let storage = RedbStorage::open(&path).unwrap();
        storage.write(&[put("a", b"1", None)]).unwrap();
        storage.write(&[put("b", b"2", None)]).unwrap();
        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed);
        drop(storage);
        let log = save_log::path_of(&crashed);
        let before = std::fs::read(&log).unwrap();
        assert_eq!(inspect(&crashed).unwrap(), SaveLogState::Own { batches: 2 });
        assert_eq!(std::fs::read(&log).unwrap(), before, "read only");
        assert_eq!(folded_epoch(&crashed), 0, "nothing folded by a look");
        // Opened, the two batches are folded: none is left to fold.
        drop(RedbStorage::open(&crashed).unwrap());
        assert_eq!(inspect(&crashed).unwrap(), SaveLogState::Own { batches: 0 });
        // A database moved aside leaves a log the new one does not record:
        // replaced at its opening, whatever the file holds.
        std::fs::rename(&crashed, dir.path().join("aside.redb")).unwrap();
        assert_eq!(inspect(&crashed).unwrap(), SaveLogState::Foreign);
        std::fs::write(&log, b"not a log at all").unwrap();
        assert_eq!(inspect(&crashed).unwrap(), SaveLogState::Foreign);
        std::fs::remove_file(&log).unwrap();
        assert_eq!(inspect(&crashed).unwrap(), SaveLogState::Absent);
        // The log a database records: removed, its saves are lost; not a
        // save log, it stops the opening, and the check.
        let log = save_log::path_of(&path);
        std::fs::remove_file(&log).unwrap();
        assert_eq!(inspect(&path).unwrap(), SaveLogState::Missing);
        std::fs::write(&log, b"not a log at all").unwrap();
        let err = inspect(&path).unwrap_err().to_string();
        assert!(err.contains("is not a save log"), "{err}");
        assert!(RedbStorage::open(&path).is_err());
    }

    #[test]
    fn a_quarantine_moves_a_record_still_in_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RedbStorage::open(dir.path().join("s.redb")).unwrap();
        storage.write(&[put("a", b"garbled", Some(5))]).unwrap();
        storage.quarantine(b"a", "test").unwrap();
        assert_eq!(storage.load(b"a").unwrap(), None);
        assert!(storage.deadlines().unwrap().is_empty());
        assert_eq!(storage.quarantined().unwrap(), vec![b"a".to_vec()]);
    }
}
