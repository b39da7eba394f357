//! Start-up processing, retention, and storage failures through the
//! service facade.

use crate::common::send_request;
use crate::world::*;
use estafeta_exchange::ErrorKind;
use estafeta_exchange::Upload;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::*;
use estafeta_session::Timestamp as SessionTime;
use std::time::Duration;

const T0: u64 = 1_800_000_000_000;
const DAY: u64 = 86_400_000;

/// The name of a message file in the folder `dir` (not a hidden one).
fn a_message_in(dir: &std::path::Path) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| !n.starts_with('.'))
        .expect("a message file")
}

/// Restart the world's exchange at `at` (ms since the epoch).
async fn restart(w: World, at: u64) -> (estafeta_exchange::Exchange, World) {
    let w = w.restart(SessionTime(at)).await;
    (w.ex.clone(), w)
}

#[tokio::test(start_paused = true)]
async fn restart_removes_timed_out_started_processes() {
    let w = World::new().await;
    let (_, pid) = w.started(1).await;
    let (_, w) = restart(w, T0 + 3_600_000).await;
    assert_eq!(w.state(&pid).await, ProcessState::TimedOut);
    assert_eq!(
        w.start().await.status,
        StartStatus::Ok,
        "the message is free again"
    );
}

#[tokio::test(start_paused = true)]
async fn orphans_in_prepared_are_moved_to_unknown() {
    let w = World::new().await;
    let pid = w.prepared(1, 1).await;
    assert_eq!(w.rollback(&pid).await, CallStatus::Ok);
    // A reply file nobody refers to (as if a delete had failed).
    let prepared = w.data().join("db-a/Prepared");
    let stray = estafeta_exchange::mailbox::FileName {
        created_at: estafeta_exchange::Timestamp::from_millis(T0 as i64),
        id: estafeta_exchange::MessageId::from_parts(T0, 42),
        from: "db-a".parse().unwrap(),
        to: "phone-1".parse().unwrap(),
        subsystem: "sales".parse().unwrap(),
    }
    .to_string();
    std::fs::write(prepared.join(&stray), br#"{"version":1}"#).unwrap();
    let (ex, w) = restart(w, T0 + 1000).await;
    let _ = ex;
    assert_eq!(w.files("db-a", Folder::Prepared), 0);
    assert!(w.data().join("db-a/Unknown").join(&stray).exists());
}

#[tokio::test(start_paused = true)]
async fn retention_removes_old_files_but_not_live_ones() {
    let w = World::new().await;
    let pid = w.prepared_with_an_incorrect().await;
    w.commit(&pid).await;
    assert_eq!(
        (w.files("db-a", Folder::Log), w.files("db-a", Folder::Error)),
        (1, 1)
    );
    // A live process on a fresh message, prepared (a reply in Prepared).
    let live = w.prepared(1, 1).await;
    let (ex, w) = restart(w, T0 + 91 * DAY).await;
    // Ready before the sweep: the old files are still there.
    assert_eq!(w.files("db-a", Folder::Log), 1);
    let tidied = ex.tidy().await.unwrap();
    assert_eq!(tidied.expired_files, 2, "the start-up tidying sweeps");
    assert_eq!(tidied.unusable, 0);
    let removed = ex.retention_sweep().await.unwrap();
    assert_eq!(removed, 0, "start-up already swept");
    assert_eq!(w.files("db-a", Folder::Log), 0);
    assert_eq!(w.files("db-a", Folder::Error), 0);
    // The live process was put in doubt at start-up; its files are kept.
    assert_eq!(w.state(&live).await, ProcessState::InDoubt);
    assert_eq!(w.files("db-a", Folder::Unknown), 2);
    assert_eq!(
        w.files("phone-1", Folder::Messages),
        1,
        "inboxes are not swept"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_503_and_other_databases_go_on() {
    let w = World::new().await;
    // db-a's queue folder is replaced by a file: every write there fails.
    let queue = w.data().join("db-a/Messages");
    std::fs::create_dir_all(w.data().join("db-a")).unwrap();
    std::fs::write(&queue, b"not a folder").unwrap();
    let req = |to: &str| send_request(to, "{}", Some(&format!("key-{to}")));
    let e = w.ex.send(&w.phone, req("db-a")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    let (_, created) = w.ex.send(&w.phone, req("db-b")).await.unwrap();
    assert_eq!(created, estafeta_exchange::Upload::Created);
    // Once the folder is back, the retry with the same key writes the
    // message the key recorded (the failure could have been one whose
    // outcome is unknown): one message, answered as the repeat it is.
    std::fs::remove_file(&queue).unwrap();
    std::fs::create_dir(&queue).unwrap();
    let (accepted, again) = w.ex.send(&w.phone, req("db-a")).await.unwrap();
    assert_eq!(again, estafeta_exchange::Upload::Repeated);
    assert_eq!(w.files("db-a", Folder::Messages), 1);
    let (twice, _) = w.ex.send(&w.phone, req("db-a")).await.unwrap();
    assert_eq!(twice.id, accepted.id);
    assert_eq!(w.files("db-a", Folder::Messages), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn device_counters_are_durable() {
    let w = World::new().await;
    let req = |key| send_request("db-a", r#"{"n":1}"#, key);
    w.ex.send(&w.phone, req(None)).await.unwrap();
    w.ex.send(&w.phone, req(Some("k"))).await.unwrap();
    w.ex.send(&w.phone, req(Some("k"))).await.unwrap();
    let (_, w) = restart(w, T0 + 1000).await;
    let stats = w.ex.stats(&w.admin).await.unwrap();
    let phone = stats
        .devices
        .iter()
        .find(|d| d.id.to_string() == "phone-1")
        .unwrap();
    assert_eq!((phone.sent, phone.duplicates), (2, 1));
}

/// Records the keys of the alerts raised.
#[derive(Default)]
struct Raised(std::sync::Mutex<Vec<String>>);

impl estafeta_exchange::AlertSink for Raised {
    fn raise(&self, alert: estafeta_exchange::Alert) -> estafeta_session::BoxFuture<'_, ()> {
        self.0.lock().unwrap().push(alert.key);
        Box::pin(async {})
    }
    fn clear(&self, _key: String) -> estafeta_session::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Opens the exchange at `at` (ms) without start-up processing, its alerts
/// recorded, and has a reader touch the database sessions (as the expiry
/// manager could) before start-up processing begins; the reader is given
/// every chance to get through (its session load runs on a blocking
/// thread) before this returns.
async fn open_with_a_reader(
    dir: &std::path::Path,
    at: u64,
) -> (
    estafeta_exchange::Exchange,
    std::sync::Arc<Raised>,
    tokio::task::JoinHandle<ProcessList>,
) {
    let raised = std::sync::Arc::new(Raised::default());
    let sinks = estafeta_exchange::Sinks {
        alerts: raised.clone(),
        ..Default::default()
    };
    let ex = open_unrecovered(dir, SessionTime(at), sinks).await;
    let reader = {
        let ex = ex.clone();
        tokio::spawn(async move {
            ex.processes(&estafeta_exchange::tenancy::Principal::Admin)
                .await
                .unwrap()
        })
    };
    for _ in 0..200 {
        if reader.is_finished() {
            break;
        }
        tokio::task::spawn_blocking(|| ()).await.unwrap();
        tokio::task::yield_now().await;
    }
    (ex, raised, reader)
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passed_while_down_waits_for_start_up_processing_then_alerts() {
    let w = World::new().await;
    let pid = w.prepared(1, 1).await;
    let World { dir, ex, .. } = w;
    close(ex).await;

    // Opened past the READY_TO_COMMIT deadline, and the process's session
    // is touched (the expiry manager, or here a reader) before start-up
    // processing: nothing may happen to it before start-up processing
    // begins, and then its alert reaches the sink given at open.
    let (ex, raised, reader) = open_with_a_reader(dir.path(), T0 + 3_600_000).await;
    assert!(!reader.is_finished(), "the session hook waits");
    assert!(raised.0.lock().unwrap().is_empty());
    assert_eq!(
        ex.phase().borrow().clone(),
        estafeta_exchange::Phase::Starting
    );
    ex.recover().await.unwrap();
    assert!(ex.is_ready());
    let listed = reader.await.unwrap();
    assert_eq!(listed.processes[0].state, ProcessState::InDoubt);
    assert_eq!(*raised.0.lock().unwrap(), [format!("in_doubt:{pid}")]);
}

/// An upload to db-a with the idempotency key `key`.
fn keyed(key: &str) -> SendMessage {
    send_request("db-a", r#"{"n":1}"#, Some(key))
}

/// A keyed upload's file appears only once its key is saved, and its rename
/// is not waited for on disk: a crash may leave it written in a confirmed
/// spare. The start publishes such a file if the device's record keeps its
/// key (it may have been answered: a retry finds it), and removes it if not
/// (never answered: the retry makes it anew).
#[tokio::test(start_paused = true)]
async fn a_keyed_upload_a_crash_left_unpublished_appears_only_if_its_key_was_saved() {
    let w = World::new().await;
    let (sent, _) = w.ex.send(&w.phone, keyed("k-1")).await.unwrap();
    let queue = w.data().join("db-a/Messages");
    let name = a_message_in(&queue);
    let prefix = estafeta_exchange::mailbox::CONFIRMED_SPARE_PREFIX;
    let spare = |n: u32| queue.join(format!("{prefix}{n}.zz99.tmp"));
    // The accepted upload's rename, lost.
    std::fs::rename(queue.join(&name), spare(0)).unwrap();
    // Another upload's file, written while its key's save was under way,
    // which the crash cut: the same message under another id.
    let mut other: serde_json::Value =
        serde_json::from_slice(&std::fs::read(spare(0)).unwrap()).unwrap();
    let id = other["id"].as_str().unwrap().to_owned();
    let other_id = format!(
        "{}{}",
        &id[..id.len() - 1],
        if id.ends_with('0') { '1' } else { '0' }
    );
    other["id"] = other_id.into();
    std::fs::write(spare(1), serde_json::to_vec(&other).unwrap()).unwrap();

    let w = w.restart_as_after_a_crash(SessionTime(T0 + 1_000)).await;
    let ex = w.ex.clone();
    let left: Vec<String> = std::fs::read_dir(&queue)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.') || n.ends_with(".zz99.tmp"))
        .collect();
    assert_eq!(
        left,
        vec![name],
        "the accepted one published, the other removed"
    );
    let (again, outcome) = ex.send(&w.phone, keyed("k-1")).await.unwrap();
    assert_eq!((again.id, outcome), (sent.id, Upload::Repeated));
    assert_eq!(w.files("db-a", Folder::Messages), 1);
}

/// A key is remembered across restarts for its time to live, then
/// forgotten: the same key makes a new message, and the retention sweep
/// removes the expired entry from the key store.
#[tokio::test(start_paused = true)]
async fn idempotency_keys_survive_restarts_and_expire_one_by_one() {
    let w = World::new().await;
    let (first, _) = w.ex.send(&w.phone, keyed("k")).await.unwrap();
    let (_, w) = restart(w, T0 + DAY).await;
    let (again, outcome) = w.ex.send(&w.phone, keyed("k")).await.unwrap();
    assert_eq!((again.id, outcome), (first.id, Upload::Repeated));
    // A second key, a day younger than the first.
    w.ex.send(&w.phone, keyed("k2")).await.unwrap();
    // Seven days after the first upload, only the first key is forgotten.
    let (_, w) = restart(w, T0 + 7 * DAY + 1).await;
    let (new, outcome) = w.ex.send(&w.phone, keyed("k")).await.unwrap();
    assert_eq!(outcome, Upload::Created);
    assert_ne!(new.id, first.id);
    let (_, outcome) = w.ex.send(&w.phone, keyed("k2")).await.unwrap();
    assert_eq!(outcome, Upload::Repeated);
    assert_eq!(w.files("db-a", Folder::Messages), 3);
    // Past every expiry, the sweep empties the store.
    let (_, w) = restart(w, T0 + 30 * DAY).await;
    w.ex.retention_sweep().await.unwrap();
    let layout = estafeta_exchange::DataLayout::new(w.data());
    let World { ex, dir, .. } = w;
    close(ex).await;
    use estafeta_exchange::keys::UploadKeys;
    let keys = estafeta_exchange::keys::RedbKeys::open(layout.keys()).unwrap();
    assert_eq!(keys.len().unwrap(), 0);
    drop(dir);
}

/// Keys a device session holds from before the key store are honoured
/// until they expire.
#[tokio::test(start_paused = true)]
async fn keys_kept_in_a_device_session_are_still_honoured() {
    let w = World::new().await;
    let plain = send_request("db-a", r#"{"n":1}"#, None);
    let (sent, _) = w.ex.send(&w.phone, plain).await.unwrap();
    let name = a_message_in(&w.data().join("db-a/Messages"));
    let data = w.data();
    let World { ex, dir, phone, .. } = w;
    close(ex).await;
    let at = Timestamp::from_millis(i64::try_from(T0).unwrap());
    let state = format!(
        r#"{{"keys":{{"old-key":{{"name":"{name}","at":"{at}"}}}},"device":{{"sent":1}}}}"#
    );
    write_old_record(&data, b"dev/phone-1", &state, T0);
    let ex = open(
        dir.path(),
        SessionTime(T0 + DAY),
        estafeta_exchange::Sinks::default(),
    )
    .await;
    let (again, outcome) = ex.send(&phone, keyed("old-key")).await.unwrap();
    assert_eq!((again.id, outcome), (sent.id, Upload::Repeated));
    // Expired, the old key no longer matches.
    close(ex).await;
    let ex = open(
        dir.path(),
        SessionTime(T0 + 8 * DAY),
        estafeta_exchange::Sinks::default(),
    )
    .await;
    let (_, outcome) = ex.send(&phone, keyed("old-key")).await.unwrap();
    assert_eq!(outcome, Upload::Created);
}

#[tokio::test(start_paused = true)]
async fn a_failed_commit_retried_at_start_up_before_the_mailboxes_are_made_raises_no_alert() {
    let w = World::new().await;
    let pid = w.prepared(1, 1).await;
    let log = w.data().join("db-a/Log");
    std::fs::write(&log, b"not a folder").unwrap();
    assert_eq!(w.commit(&pid).await, CallStatus::Failed);
    let data = w.data();
    let World {
        dir, ex, db, phone, ..
    } = w;
    close(ex).await;
    // While the server is down the cause goes: the Log folder is not
    // there at all until start-up processing makes the mailboxes' folders.
    std::fs::remove_file(&log).unwrap();

    // Opened past the retry, the session touched before start-up
    // processing begins: its deadline handling is the first thing to run
    // once it may, before the mailboxes are made.
    let (ex, raised, reader) = open_with_a_reader(dir.path(), T0 + 3_600_000).await;
    ex.recover().await.unwrap();
    reader.await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let state = ex.process_status(&db, &pid).await.unwrap().state;
    assert_eq!(state, ProcessState::Done);
    assert_eq!(std::fs::read_dir(data.join("db-a/Log")).unwrap().count(), 1);
    let inbox: Inbox = serde_json::from_slice(&ex.inbox(&phone, None).await.unwrap()).unwrap();
    assert_eq!(inbox.messages.len(), 1, "the reply is delivered");
    assert!(
        raised.0.lock().unwrap().is_empty(),
        "no alert: {:?}",
        raised.0.lock().unwrap()
    );
}

/// An upload answered once its durable spare was fsynced, whose rename to
/// its name a crash lost (the message is the spare's file), is published
/// before start-up processing moves anything: the READY_TO_COMMIT process
/// that holds it puts it in doubt with the rest, its late commit logs it,
/// and no start hands it out again.
#[tokio::test(start_paused = true)]
async fn an_upload_whose_rename_a_crash_lost_is_there_for_start_up_processing() {
    let w = World::new().await;
    let pid = w.prepared(2, 1).await;
    let queue = w.data().join("db-a/Messages");
    let message = a_message_in(&queue);
    let spare = format!(
        "{}0.zz99.tmp",
        estafeta_exchange::mailbox::DURABLE_SPARE_PREFIX
    );
    std::fs::rename(queue.join(&message), queue.join(&spare)).unwrap();

    let w = w.restart_as_after_a_crash(SessionTime(T0 + 100_000)).await;
    let ex = w.ex.clone();
    assert_eq!(w.state(&pid).await, ProcessState::InDoubt);
    assert!(w.data().join("db-a/Unknown").join(&message).exists());
    assert!(!queue.join(&spare).exists());
    assert_eq!(w.files("db-a", Folder::Messages), 0);
    let r = ex
        .commit(&w.db, &pid, CommitRequest { version: Version })
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Ok);
    assert_eq!(w.files("db-a", Folder::Log), 2);
    assert_eq!(w.start().await.status, StartStatus::Idle);
}

/// A clean stop leaves its marker once every write is durable and no
/// spare is left; the next start, finding it, skips the look for the
/// uploads a crash leaves unpublished (a read of every database's queue
/// before the server is ready), and removes the marker before anything
/// is written, so that a crash in that run is looked for at the start
/// after it.
#[tokio::test(start_paused = true)]
async fn a_start_after_a_clean_stop_skips_the_look_for_a_crashs_uploads() {
    let w = World::new().await;
    w.ex.send(&w.phone, keyed("k-1")).await.unwrap();
    let queue = w.data().join("db-a/Messages");
    let name = a_message_in(&queue);
    let marker = estafeta_exchange::DataLayout::new(w.data()).clean_stop();
    assert!(!marker.exists(), "none while serving");

    // A confirmed spare whose key the record keeps, where no clean stop
    // can leave one (put here between the stop and the start): a start
    // that finds the marker does not read the queue for it.
    let w = w.restart(SessionTime(T0 + 1_000)).await;
    assert!(!marker.exists(), "the start removed it");
    let spare = queue.join(format!(
        "{}0.zz99.tmp",
        estafeta_exchange::mailbox::CONFIRMED_SPARE_PREFIX
    ));
    let World { ex, dir, .. } = w;
    close(ex).await;
    assert!(marker.exists(), "a clean stop leaves it");
    std::fs::rename(queue.join(&name), &spare).unwrap();
    let ex = open(
        dir.path(),
        SessionTime(T0 + 2_000),
        estafeta_exchange::Sinks::default(),
    )
    .await;
    assert!(!marker.exists());
    assert!(
        spare.exists() && !queue.join(&name).exists(),
        "not looked for"
    );
    close(ex).await;

    // Without the marker (as after a crash) the start looks, and
    // publishes it.
    std::fs::remove_file(&marker).unwrap();
    let ex = open(
        dir.path(),
        SessionTime(T0 + 3_000),
        estafeta_exchange::Sinks::default(),
    )
    .await;
    assert!(queue.join(&name).exists() && !spare.exists());
    close(ex).await;
}
