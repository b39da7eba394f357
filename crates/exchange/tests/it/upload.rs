//! An upload on the embedded store: its message file written while its
//! idempotency key is recorded, appearing only once the key is durable,
//! and the device's counters saved beside them, back to what they were
//! when the upload fails.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{id, send_request};
use crate::world;
use crate::world::World;
use estafeta_exchange::keys::{KeyedUpload, KeysError, UploadKeys};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::*;
use estafeta_exchange::{ErrorKind, Exchange, Id, Sinks, Stores, Timestamp, Upload};
use estafeta_session::Timestamp as SessionTime;

const T0: u64 = 1_800_000_000_000;

/// What the test key store does with a put.
enum Puts {
    /// Tells the test it began, then waits for its go-ahead.
    Held {
        began: Sender<()>,
        go: Mutex<Receiver<()>>,
    },
    /// Fails, as a key store out of reach.
    Failing,
}

/// The embedded key store, with its puts held or failing.
struct Keys {
    inner: Arc<dyn UploadKeys>,
    puts: Puts,
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
    fn put_all(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        match &self.puts {
            Puts::Held { began, go } => {
                began.send(()).unwrap();
                go.lock().unwrap().recv().unwrap();
                self.inner.put_all(entries)
            }
            Puts::Failing => Err(KeysError::Unavailable("the key store is away".into())),
        }
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

/// An exchange on `data` whose key store's puts do as `puts` says, with a
/// database `db-a` and a device `phone-1` (made on the first open): the
/// device's principal.
async fn open(data: &std::path::Path, puts: Puts) -> (Exchange, Principal) {
    let (config, clock) = world::config_and_clock(data, SessionTime(T0));
    let mut stores = Stores::embedded(data, clock.clone(), &config.quiesce)
        .await
        .unwrap();
    stores.keys = Arc::new(Keys {
        inner: stores.keys,
        puts,
    });
    let (ex, _) = Exchange::open(config, clock, Sinks::default(), stores)
        .await
        .unwrap();
    ex.recover().await.unwrap();
    let (_, phone) = world::provision_acme(&ex).await;
    (ex, phone)
}

/// An upload of order 17 to db-a with the idempotency key `key`.
fn upload(key: Option<&str>) -> SendMessage {
    send_request("db-a", r#"{"order":17}"#, key)
}

/// The names in `db-a`'s queue: (message files, hidden temporary files).
fn queue(data: &std::path::Path) -> (usize, usize) {
    let names: Vec<String> = std::fs::read_dir(data.join("db-a").join("Messages"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
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

/// While the key is being recorded, the message's file is written (and
/// fsynced) under its temporary name, not in the queue; it appears once the
/// key is durable, and the upload is answered then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_uploads_file_is_written_while_its_key_is_recorded_and_appears_after() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (began, begun) = std::sync::mpsc::channel();
    let (go, waits) = std::sync::mpsc::channel();
    let puts = Puts::Held {
        began,
        go: Mutex::new(waits),
    };
    let (ex, phone) = open(&data, puts).await;
    let sending = {
        let (ex, phone) = (ex.clone(), phone.clone());
        tokio::spawn(async move { ex.send(&phone, upload(Some("order-17"))).await })
    };
    let begun = tokio::task::spawn_blocking(move || begun.recv_timeout(Duration::from_secs(30)));
    begun.await.unwrap().expect("the key's put began");
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
    // The key was recorded: the retry is the same message.
    let (again, outcome) = ex.send(&phone, upload(Some("order-17"))).await.unwrap();
    assert_eq!((again.id, outcome), (accepted.id, Upload::Repeated));
    assert_eq!(queue(&data), (1, 0));
}

/// A key that cannot be recorded fails the upload: no message appears, its
/// temporary file goes, and the device's counters are as they were (after
/// a restart too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_key_cannot_be_recorded_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ex, phone) = open(&data, Puts::Failing).await;
    let e = ex.send(&phone, upload(Some("order-17"))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert_eq!(queue(&data), (0, 0));
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
