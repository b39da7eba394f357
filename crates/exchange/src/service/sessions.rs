//! The exchange's sessions: one engine per kind, each with its own key and
//! record type — databases ([`DbRecord`] by [`Id`]), devices
//! ([`DeviceRecord`] by [`Id`]) and processes ([`ProcessRecord`] by
//! [`ProcessId`]). The three share one durable store, each in its own
//! [`Namespace`] of it.

use super::records::{DbRecord, DeviceRecord, Owner, ProcessRecord};
use crate::{Id, ProcessId};
use estafeta_session::index::DefaultIndex;
use estafeta_session::storage::{Pending, Shared, Step, Write};
use estafeta_session::{
    Clock, Engine, Error, Hooks, Loaded, Stats, Storage, StorageError, Timestamp,
};
use std::sync::Arc;
use std::time::Instant;

use super::observer::{CommitObserver, Durable, TimedStep, committed};

/// One kind's part of a shared store: its keys are stored behind a
/// prefix of their own, so the kinds never meet.
pub(crate) struct Namespace {
    prefix: &'static [u8],
    inner: Arc<dyn Storage>,
    /// Told of each commit (the server's metrics).
    observer: Option<Arc<dyn CommitObserver>>,
}

impl Namespace {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        [self.prefix, key].concat()
    }

    fn own<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        key.strip_prefix(self.prefix)
    }
}

/// `w` as the inner store keeps it: its key behind `prefix`.
fn behind(prefix: &[u8], w: &Write) -> Write {
    let key = |k: &[u8]| [prefix, k].concat();
    match w {
        Write::Put {
            key: k,
            record,
            expires_at,
        } => Write::Put {
            key: key(k),
            record: record.clone(),
            expires_at: *expires_at,
        },
        Write::Delete { key: k } => Write::Delete { key: key(k) },
    }
}

/// The prefix of each kind's keys in the shared store.
const DATABASES: &[u8] = b"db/";
const DEVICES: &[u8] = b"dev/";
const PROCESSES: &[u8] = b"pid/";

impl Storage for Namespace {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.load(&self.key(key))
    }

    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        let batch: Vec<Write> = batch.iter().map(|w| behind(self.prefix, w)).collect();
        let started = Instant::now();
        let written = self.inner.write(&batch);
        committed(self.observer.as_ref(), Durable::Sessions, started);
        written
    }

    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError> {
        Ok(self
            .inner
            .deadlines()?
            .into_iter()
            .filter_map(|(k, t)| Some((self.own(&k)?.to_vec(), t)))
            .collect())
    }

    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
        self.inner.quarantine(&self.key(key), reason)
    }

    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        Ok(self
            .inner
            .quarantined()?
            .into_iter()
            .filter_map(|k| Some(self.own(&k)?.to_vec()))
            .collect())
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }

    fn shared(&self) -> Option<&dyn Shared> {
        self.inner.shared().map(|_| self as &dyn Shared)
    }
}

/// A shared store's steps and due keys, within the kind's prefix.
impl Shared for Namespace {
    fn begin<'a>(&'a self, key: &'a [u8]) -> Pending<'a, Box<dyn Step>> {
        Box::pin(async move {
            let shared = self.inner.shared().ok_or(StorageError::Conflict)?;
            let step = shared.begin(&self.key(key)).await?;
            Ok(match &self.observer {
                Some(observer) => Box::new(TimedStep {
                    inner: step,
                    observer: observer.clone(),
                }),
                None => step,
            })
        })
    }

    fn due<'a>(
        &'a self,
        prefix: &'a [u8],
        now: Timestamp,
        limit: usize,
    ) -> Pending<'a, Vec<Vec<u8>>> {
        Box::pin(async move {
            let Some(shared) = self.inner.shared() else {
                return Ok(Vec::new());
            };
            Ok(shared
                .due(&self.key(prefix), now, limit)
                .await?
                .into_iter()
                .filter_map(|k| Some(self.own(&k)?.to_vec()))
                .collect())
        })
    }
}

/// The engines opened, the database engine not started: its hooks hold
/// a `Weak` to the parts that will own it.
pub(crate) struct Opening {
    db: Loaded<Id, DbRecord, DefaultIndex<Id>>,
    device: Engine<Id, DeviceRecord>,
    process: Engine<ProcessId, ProcessRecord>,
    /// Whether other servers share the store (and change its records).
    shared: bool,
}

impl Opening {
    /// Whether other servers share the store (and change its records).
    pub(crate) fn shared(&self) -> bool {
        self.shared
    }

    /// Start the database engine with `hooks` (without waiting).
    pub(crate) fn start(self, hooks: Arc<dyn Hooks<Id, DbRecord>>) -> Sessions {
        Sessions {
            db: self.db.hooks(hooks).start(),
            device: self.device,
            process: self.process,
        }
    }
}

/// The three engines.
pub(crate) struct Sessions {
    /// Databases: the live process, those in doubt, the recent ones.
    pub(crate) db: Engine<Id, DbRecord>,
    /// Devices: counters and webhooks (uploads are serialized on them).
    pub(crate) device: Engine<Id, DeviceRecord>,
    /// Processes: which database owns each and how it ended.
    pub(crate) process: Engine<ProcessId, ProcessRecord>,
}

impl Sessions {
    /// Open the device engine over `storage`, the process engine over
    /// `processes` and load the database engine's expiry index (over
    /// `storage`); [`Opening::start`] starts the
    /// latter with the exchange's hooks (deadlines and start-up
    /// processing). The other kinds have no hooks (a process record ends
    /// when its retention deadline passes).
    pub(crate) async fn open(
        storage: Arc<dyn Storage>,
        processes: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
        observer: Option<&Arc<dyn CommitObserver>>,
    ) -> Result<Opening, Error> {
        let part = |prefix, inner: &Arc<dyn Storage>| -> Arc<dyn Storage> {
            Arc::new(Namespace {
                prefix,
                inner: inner.clone(),
                observer: observer.cloned(),
            })
        };
        Ok(Opening {
            shared: storage.shared().is_some(),
            db: Engine::builder(part(DATABASES, &storage))
                .clock(clock.clone())
                .load()
                .await?,
            device: Engine::builder(part(DEVICES, &storage))
                .clock(clock.clone())
                .open()
                .await?,
            process: Engine::builder(part(PROCESSES, &processes))
                .clock(clock)
                .open()
                .await?,
        })
    }

    /// The write that stores `record` as the process `pid`'s session,
    /// expiring at `expires_at`, as the shared store keeps it (its key
    /// behind the processes' prefix): for a database's step to write beside
    /// its own record ([`Step::put_beside`]).
    pub(crate) fn process_write(
        &self,
        pid: &ProcessId,
        record: ProcessRecord,
        expires_at: Option<Timestamp>,
    ) -> Result<Write, Error> {
        let write = self.process.record(pid, record, expires_at)?;
        Ok(behind(PROCESSES, &write))
    }

    /// The owner record of process `pid`, if it was ever issued.
    pub(crate) async fn owner(&self, pid: &ProcessId) -> Result<Option<Owner>, Error> {
        Ok(match self.process.get(*pid, false).await? {
            Some(g) => g.state().owner.clone(),
            None => None,
        })
    }

    /// Stop every engine (each saves its dirty sessions); the first error.
    pub(crate) async fn stop(&self) -> Result<(), Error> {
        let db = self.db.stop().await;
        let device = self.device.stop().await;
        let process = self.process.stop().await;
        db.and(device).and(process)
    }

    /// The engines' figures, added up.
    pub(crate) fn stats(&self) -> Stats {
        let [a, b, c] = [self.db.stats(), self.device.stats(), self.process.stats()];
        Stats {
            in_memory: a.in_memory + b.in_memory + c.in_memory,
            queued: a.queued + b.queued + c.queued,
            loads: a.loads + b.loads + c.loads,
            saves: a.saves + b.saves + c.saves,
            save_batches: a.save_batches + b.save_batches + c.save_batches,
            flushes: a.flushes + b.flushes + c.flushes,
            expiries: a.expiries + b.expiries + c.expiries,
            finalize_calls: a.finalize_calls + b.finalize_calls + c.finalize_calls,
            storage_errors: a.storage_errors + b.storage_errors + c.storage_errors,
            quarantined: a.quarantined + b.quarantined + c.quarantined,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use estafeta_session::MemoryStorage;

    #[test]
    fn each_kind_sees_only_its_own_keys() {
        let store = Arc::new(MemoryStorage::new());
        let db = Namespace {
            prefix: b"db/",
            inner: store.clone(),
            observer: None,
        };
        let dev = Namespace {
            prefix: b"dev/",
            inner: store.clone(),
            observer: None,
        };
        let put = |key: &[u8], at| Write::Put {
            key: key.to_vec(),
            record: vec![1],
            expires_at: Some(Timestamp(at)),
        };
        db.write(&[put(b"a", 1)]).unwrap();
        dev.write(&[put(b"a", 2)]).unwrap();
        assert_eq!(db.deadlines().unwrap(), vec![(b"a".to_vec(), Timestamp(1))]);
        assert_eq!(
            dev.deadlines().unwrap(),
            vec![(b"a".to_vec(), Timestamp(2))]
        );
        // The store keeps the key layout of one shared table.
        assert!(store.load(b"db/a").unwrap().is_some());
        assert!(store.load(b"dev/a").unwrap().is_some());
        db.write(&[Write::Delete { key: b"a".to_vec() }]).unwrap();
        assert!(db.load(b"a").unwrap().is_none());
        assert!(dev.load(b"a").unwrap().is_some());
    }

    /// Records written when one record type served all three kinds (one
    /// flat JSON object, the kind told by the key's prefix) load as the
    /// typed records, under the same keys.
    #[tokio::test]
    async fn records_of_the_shared_layout_load() {
        let store = Arc::new(MemoryStorage::new());
        let old = |state: &str| {
            let mut bytes = vec![estafeta_session::record::FORMAT_VERSION];
            bytes.extend(
                format!(
                    r#"{{"created_at":1,"last_access":1,"expires_at":null,"generation":0,"state":{state}}}"#
                )
                .bytes(),
            );
            bytes
        };
        store.put_raw(
            b"db/db-a",
            &old(r#"{"counters":{"ended":2},"webhook":"http://h/db"}"#),
        );
        store.put_raw(
            b"dev/phone-1",
            &old(r#"{"device":{"sent":3},"webhook":"http://h/dev"}"#),
        );
        let pid: ProcessId = "01JD6Y0000000000000000000A".parse().unwrap();
        store.put_raw(
            format!("pid/{pid}").as_bytes(),
            &old(r#"{"owner":{"db":"db-a","ended":"DONE"}}"#),
        );
        let part = |prefix| -> Arc<dyn Storage> {
            Arc::new(Namespace {
                prefix,
                inner: store.clone(),
                observer: None,
            })
        };
        let db: Engine<Id, DbRecord> = Engine::builder(part(b"db/")).open().await.unwrap();
        let device: Engine<Id, DeviceRecord> = Engine::builder(part(b"dev/")).open().await.unwrap();
        let process: Engine<ProcessId, ProcessRecord> =
            Engine::builder(part(b"pid/")).open().await.unwrap();

        let g = db
            .get("db-a".parse().unwrap(), false)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g.state().counters.ended, 2);
        assert_eq!(g.state().webhook.as_deref(), Some("http://h/db"));
        drop(g);
        let g = device
            .get("phone-1".parse().unwrap(), false)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g.state().device.sent, 3);
        assert_eq!(g.state().webhook.as_deref(), Some("http://h/dev"));
        drop(g);
        let g = process.get(pid, false).await.unwrap().unwrap();
        let owner = g.state().owner.clone().unwrap();
        assert_eq!(owner.db.as_str(), "db-a");
        assert_eq!(owner.ended, Some(crate::wire::ProcessState::Done));
        drop(g);
        assert!(
            db.get("phone-1".parse().unwrap(), false)
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(store.quarantined().unwrap(), Vec::<Vec<u8>>::new());
    }
}
