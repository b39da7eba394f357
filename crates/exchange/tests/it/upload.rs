//! An upload on the embedded store: a keyed upload's key kept in the
//! device's record and saved with its counters in one commit, while its
//! message file is written; the file appearing only once that commit is
//! durable; the record's keys handed to the key store in batches; and the
//! counters back to what they were when the upload fails.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{id, send_request};
use crate::world;
use crate::world::World;
use estafeta_exchange::keys::{KeyedUpload, KeysError, UploadKeys};
use estafeta_exchange::mailbox::is_idle_spare;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::*;
use estafeta_exchange::{ErrorKind, Exchange, Id, Sinks, Stores, Timestamp, Upload};
use estafeta_session::Timestamp as SessionTime;
use estafeta_session::storage::{Storage, StorageError, Write};

const T0: u64 = 1_800_000_000_000;

/// How many keys a device's record keeps before it hands them to the key
/// store (the exchange's `KEYS_IN_RECORD`).
const KEYS_IN_RECORD: usize = 32;

/// What a test store does with a write while it is armed.
enum Writes {
    /// Tells the test it began, then waits for its go-ahead (once: the
    /// store disarms itself).
    Held {
        began: Sender<()>,
        go: Mutex<Receiver<()>>,
    },
    /// Fails, as a store out of reach.
    Failing,
    /// Goes through.
    Through,
}

/// A store's writes, as `writes` says while `armed`; how many were made.
struct Faults {
    writes: Writes,
    armed: AtomicBool,
    made: AtomicUsize,
}

impl Faults {
    fn new(writes: Writes) -> Arc<Faults> {
        Arc::new(Faults {
            writes,
            armed: AtomicBool::new(false),
            made: AtomicUsize::new(0),
        })
    }

    /// How many writes were made (failed ones too).
    fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }

    fn arm(&self, armed: bool) {
        self.armed.store(armed, Ordering::SeqCst);
    }

    /// A write, done by `write` unless the faults say otherwise.
    fn write<E>(
        &self,
        failed: impl FnOnce() -> E,
        write: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        self.made.fetch_add(1, Ordering::SeqCst);
        if self.armed.load(Ordering::SeqCst) {
            match &self.writes {
                Writes::Held { began, go } => {
                    self.arm(false);
                    began.send(()).unwrap();
                    go.lock().unwrap().recv().unwrap();
                }
                Writes::Failing => return Err(failed()),
                Writes::Through => {}
            }
        }
        write()
    }
}

/// The embedded key store, its puts as `faults` say.
struct Keys {
    inner: Arc<dyn UploadKeys>,
    faults: Arc<Faults>,
}

impl UploadKeys for Keys {
    fn get(
        &self,
        device: &Id,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<KeyedUpload>, KeysError> {
        self.inner.get(device, key, now)
    }
    fn reads_in_place(&self) -> bool {
        self.inner.reads_in_place()
    }
    fn put_all(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        self.faults.write(
            || KeysError::Unavailable("the key store is away".into()),
            || self.inner.put_all(entries),
        )
    }
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        device: &Id,
        key: &str,
        upload: &KeyedUpload,
    ) -> bool {
        self.inner.put_in_step(step, device, key, upload)
    }
    fn remove_device(&self, device: &Id) -> Result<u64, KeysError> {
        self.inner.remove_device(device)
    }
    fn expire(&self, now: Timestamp, max: usize) -> Result<usize, KeysError> {
        self.inner.expire(now, max)
    }
    fn len(&self) -> Result<u64, KeysError> {
        self.inner.len()
    }
}

/// The embedded session store, its writes as `faults` say.
struct Sessions {
    inner: Arc<dyn Storage>,
    faults: Arc<Faults>,
}

impl Storage for Sessions {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.load(key)
    }
    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        self.faults
            .write(|| StorageError::Injected, || self.inner.write(batch))
    }
    fn deadlines(&self) -> Result<Vec<(Vec<u8>, estafeta_session::Timestamp)>, StorageError> {
        self.inner.deadlines()
    }
    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
        self.inner.quarantine(key, reason)
    }
    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        self.inner.quarantined()
    }
    fn generation(&self) -> u64 {
        self.inner.generation()
    }
}

/// The faults of an exchange's key store and session store.
struct StoreFaults {
    keys: Arc<Faults>,
    sessions: Arc<Faults>,
}

/// An exchange on `data` whose key store's puts and session store's
/// writes do as `keys` and `sessions` say once armed, with a database
/// `db-a` and a device `phone-1` (made on the first open): the device's
/// principal, and the key store itself.
async fn open(
    data: &std::path::Path,
    faults: &StoreFaults,
) -> (Exchange, Principal, Arc<dyn UploadKeys>) {
    let (config, clock) = world::config_and_clock(data, SessionTime(T0));
    let mut stores = Stores::embedded(data, clock.clone(), &config.quiesce)
        .await
        .unwrap();
    let keys = stores.keys.clone();
    stores.keys = Arc::new(Keys {
        inner: stores.keys,
        faults: faults.keys.clone(),
    });
    let sessions: Arc<dyn Storage> = Arc::new(Sessions {
        inner: stores.sessions,
        faults: faults.sessions.clone(),
    });
    stores.sessions = sessions.clone();
    stores.process_sessions = sessions;
    let (ex, _) = Exchange::open(config, clock, Sinks::default(), stores)
        .await
        .unwrap();
    ex.recover().await.unwrap();
    let (_, phone) = world::provision_acme(&ex).await;
    (ex, phone, keys)
}

/// Faults that let every write through.
fn through() -> StoreFaults {
    StoreFaults {
        keys: Faults::new(Writes::Through),
        sessions: Faults::new(Writes::Through),
    }
}

/// An upload of order 17 to db-a with the idempotency key `key`.
fn upload(key: Option<&str>) -> SendMessage {
    send_request("db-a", r#"{"order":17}"#, key)
}

/// The names in `db-a`'s queue: (message files, hidden temporary files),
/// spares not taken (empty) left out.
fn queue(data: &std::path::Path) -> (usize, usize) {
    let names: Vec<String> = std::fs::read_dir(data.join("db-a").join("Messages"))
        .map(|d| {
            d.map(|e| e.unwrap())
                .filter(|e| {
                    let len = e.metadata().map_or(1, |m| m.len());
                    !is_idle_spare(&e.file_name().to_string_lossy(), len)
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let hidden = names.iter().filter(|n| n.starts_with('.')).count();
    (names.len() - hidden, hidden)
}

/// `phone-1`'s count of messages sent.
async fn sent(ex: &Exchange) -> u64 {
    let stats = ex.stats(&Principal::Admin).await.unwrap();
    stats
        .devices
        .iter()
        .find(|d| d.id == id("phone-1"))
        .unwrap()
        .sent
}

/// Waits (30 s at most, real time) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::task::yield_now().await;
    }
}

/// While the device's record (its counters and the new key) is being
/// committed, the message's file is written (and fsynced) under its
/// temporary name, not in the queue; it appears once the commit is
/// durable, and the upload is answered then. The key store is not
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_uploads_file_is_written_while_its_key_is_committed_and_appears_after() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (began, begun) = std::sync::mpsc::channel();
    let (go, waits) = std::sync::mpsc::channel();
    let faults = StoreFaults {
        keys: Faults::new(Writes::Failing),
        sessions: Faults::new(Writes::Held {
            began,
            go: Mutex::new(waits),
        }),
    };
    let (ex, phone, keys) = open(&data, &faults).await;
    faults.keys.arm(true);
    faults.sessions.arm(true);
    let sending = {
        let (ex, phone) = (ex.clone(), phone.clone());
        tokio::spawn(async move { ex.send(&phone, upload(Some("order-17"))).await })
    };
    let begun = tokio::task::spawn_blocking(move || begun.recv_timeout(Duration::from_secs(30)));
    begun.await.unwrap().expect("the device's commit began");
    until("the file is written under its temporary name", || {
        queue(&data) == (0, 1)
    })
    .await;
    assert!(
        !sending.is_finished(),
        "not answered before the key is durable"
    );
    go.send(()).unwrap();
    let (accepted, outcome) = sending.await.unwrap().unwrap();
    assert_eq!(outcome, Upload::Created);
    assert_eq!(queue(&data), (1, 0));
    assert_eq!(sent(&ex).await, 1);
    assert_eq!(keys.len().unwrap(), 0, "the key store was not written");
    // The key was recorded: the retry is the same message.
    let (again, outcome) = ex.send(&phone, upload(Some("order-17"))).await.unwrap();
    assert_eq!((again.id, outcome), (accepted.id, Upload::Repeated));
    assert_eq!(queue(&data), (1, 0));
    // And so after a restart.
    ex.shutdown().await.unwrap();
    drop((ex, keys));
    let ex = world::open(dir.path(), SessionTime(T0 + 1_000), Sinks::default()).await;
    let (again, outcome) = ex.send(&phone, upload(Some("order-17"))).await.unwrap();
    assert_eq!((again.id, outcome), (accepted.id, Upload::Repeated));
    assert_eq!(queue(&data), (1, 0));
}

/// A key that cannot be committed fails the upload: no message appears,
/// its temporary file goes, and the device's counters are as they were
/// (after a restart too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_key_cannot_be_committed_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let faults = StoreFaults {
        keys: Faults::new(Writes::Through),
        sessions: Faults::new(Writes::Failing),
    };
    let (ex, phone, _) = open(&data, &faults).await;
    faults.sessions.arm(true);
    let e = ex.send(&phone, upload(Some("order-17"))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert_eq!(queue(&data), (0, 0));
    faults.sessions.arm(false);
    assert_eq!(sent(&ex).await, 0);
    let (_, created) = ex.send(&phone, upload(None)).await.unwrap();
    assert_eq!(created, Upload::Created);
    assert_eq!(sent(&ex).await, 1);
    ex.shutdown().await.unwrap();
    drop(ex);
    let ex = world::open(dir.path(), SessionTime(T0 + 1_000), Sinks::default()).await;
    assert_eq!(sent(&ex).await, 1);
    assert_eq!(queue(&data), (1, 0));
}

/// A device's record keeps its latest keys; the upload that finds it full
/// hands them to the key store in one commit first. Every key is honoured
/// wherever it is kept, after a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_records_keys_go_to_the_key_store_in_one_commit_when_it_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ex, phone, keys) = open(&data, &through()).await;
    let key = |n: usize| format!("order-{n}");
    let mut ids = Vec::new();
    for n in 0..KEYS_IN_RECORD {
        let (accepted, outcome) = ex.send(&phone, upload(Some(&key(n)))).await.unwrap();
        assert_eq!(outcome, Upload::Created);
        ids.push(accepted.id);
    }
    assert_eq!(keys.len().unwrap(), 0, "the record keeps them");
    let (accepted, _) = ex
        .send(&phone, upload(Some(&key(KEYS_IN_RECORD))))
        .await
        .unwrap();
    ids.push(accepted.id);
    assert_eq!(keys.len().unwrap(), KEYS_IN_RECORD as u64, "handed over");
    let repeats = |ex: Exchange, phone: Principal, ids: Vec<_>| async move {
        for (n, id) in ids.iter().enumerate() {
            let (again, outcome) = ex.send(&phone, upload(Some(&key(n)))).await.unwrap();
            assert_eq!((again.id, outcome), (*id, Upload::Repeated), "key {n}");
        }
        ex
    };
    let ex = repeats(ex, phone.clone(), ids.clone()).await;
    assert_eq!(queue(&data), (KEYS_IN_RECORD + 1, 0));
    ex.shutdown().await.unwrap();
    drop((ex, keys));
    let ex = world::open(dir.path(), SessionTime(T0 + 1_000), Sinks::default()).await;
    repeats(ex, phone, ids).await;
    assert_eq!(queue(&data), (KEYS_IN_RECORD + 1, 0));
}

/// A hand-off the key store refuses fails the upload that needed it, with
/// nothing written; the record keeps its keys, each still honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hand_off_fails_the_upload_and_keeps_the_records_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let faults = StoreFaults {
        keys: Faults::new(Writes::Failing),
        sessions: Faults::new(Writes::Through),
    };
    let (ex, phone, _) = open(&data, &faults).await;
    faults.keys.arm(true);
    let key = |n: usize| format!("order-{n}");
    let mut ids = Vec::new();
    for n in 0..KEYS_IN_RECORD {
        ids.push(ex.send(&phone, upload(Some(&key(n)))).await.unwrap().0.id);
    }
    let e = ex
        .send(&phone, upload(Some(&key(KEYS_IN_RECORD))))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert_eq!(queue(&data), (KEYS_IN_RECORD, 0));
    assert_eq!(sent(&ex).await, KEYS_IN_RECORD as u64);
    for (n, id) in ids.iter().enumerate() {
        let (again, outcome) = ex.send(&phone, upload(Some(&key(n)))).await.unwrap();
        assert_eq!((again.id, outcome), (*id, Upload::Repeated), "key {n}");
    }
}

/// A key of the record found expired is dropped with the upload's own
/// commit: a keyed upload makes one commit of the session store, expired
/// keys or not.
#[tokio::test(start_paused = true)]
async fn an_expired_key_is_dropped_with_the_uploads_own_commit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let faults = through();
    let (ex, phone, _) = open(&data, &faults).await;
    let (first, _) = ex.send(&phone, upload(Some("order-1"))).await.unwrap();
    let week = estafeta_exchange::ExchangeConfig::new(&data).idempotency_ttl;
    tokio::time::advance(week + Duration::from_secs(1)).await;
    let before = faults.sessions.made();
    let (_, outcome) = ex.send(&phone, upload(Some("order-2"))).await.unwrap();
    assert_eq!(outcome, Upload::Created);
    assert_eq!(faults.sessions.made() - before, 1, "one commit");
    // The expired key is forgotten: its upload is a new message.
    let (again, outcome) = ex.send(&phone, upload(Some("order-1"))).await.unwrap();
    assert_eq!(outcome, Upload::Created);
    assert_ne!(again.id, first.id);
}

/// An upload whose message cannot be written leaves the device's counters
/// as they were, though they were saved while it was written: in memory
/// and, after a restart, on disk.
#[tokio::test(start_paused = true)]
async fn a_failed_upload_leaves_the_devices_counters_as_they_were() {
    let w = World::new().await;
    // db-a's queue folder is replaced by a file: every write there fails.
    let queue = w.data().join("db-a/Messages");
    std::fs::create_dir_all(w.data().join("db-a")).unwrap();
    std::fs::write(&queue, b"not a folder").unwrap();
    for key in [None, Some("order-17")] {
        let e = w.ex.send(&w.phone, upload(key)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }
    std::fs::remove_file(&queue).unwrap();
    assert_eq!(sent(&w.ex).await, 0);
    w.ex.send(&w.phone, upload(None)).await.unwrap();
    assert_eq!(sent(&w.ex).await, 1);
    let w = w.restart(SessionTime(T0 + 1_000)).await;
    assert_eq!(sent(&w.ex).await, 1);
}
