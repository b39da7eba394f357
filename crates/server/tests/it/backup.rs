//! `estafeta backup DIR` against the real binary while devices upload: the
//! copy passes `estafeta check`, and a server started on it serves the same
//! tenancy, every message acknowledged before the backup began (each in one
//! place only) and the process that was open. Backups taken while the
//! event log is written, its copy slowed down as on a slow disk, copy it
//! whole. Bad folders are refused with a clear error and change nothing.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use std::time::Duration;

use crate::common::slow_reads::SlowReads;
use crate::common::{
    Binary, PATIENCE, estafeta, id, listed, message, prepare_all, process_all, start_request,
    wait_ready,
};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{CallStatus, ProcessState, StartStatus};
use estafeta_exchange::{DataLayout, MessageId, ProcessId};
use estafeta_server::events::store::parse_key;
use estafeta_server::events::{EventFilter, EventRecord, EventStore, events_file};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "backup-admin-0123456789abcdef0123456789";

/// `estafeta serve` on the data folder `data` (run in `cwd`) with the
/// admin token [`ADMIN`], once ready; and its admin client.
async fn serve(cwd: &Path, data: &Path) -> (Binary, Client) {
    let server = Binary::serve(cwd, data, &[], &[("ESTAFETA_ADMIN_TOKEN", ADMIN)]).await;
    let admin = Client::new(&server.base, ADMIN).unwrap();
    wait_ready(&admin).await;
    (server, admin)
}

/// Runs `estafeta backup DIR` against the server at `base`; its exit
/// success, stdout and stderr.
async fn run_backup(cwd: &Path, base: &str, dir: &Path) -> (bool, String, String) {
    let out = estafeta(cwd)
        .arg("backup")
        .arg(dir)
        .env("ESTAFETA_URL", base)
        .env("ESTAFETA_ADMIN_TOKEN", ADMIN)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Tokens of enterprise `acme`'s databases `db-a` and `db-b` and devices
/// `phone-1` and `phone-2` (subsystem `sales`).
struct Tokens {
    db: String,
    db_b: String,
    phones: [String; 2],
}

async fn provision(admin: &Client) -> Tokens {
    admin.create_enterprise(&id("acme")).await.unwrap();
    admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db = |name: &'static str| async move {
        admin
            .create_database(&id("acme"), &id(name))
            .await
            .unwrap()
            .token
    };
    let device = |name: &'static str| async move {
        admin
            .create_device(&id("acme"), &id(name), &id("sales"))
            .await
            .unwrap()
            .token
    };
    Tokens {
        db: db("db-a").await,
        db_b: db("db-b").await,
        phones: [device("phone-1").await, device("phone-2").await],
    }
}

/// Leaves a process of `db-a` READY_TO_COMMIT (every start of `db-a` is
/// then BUSY): `phone-1` uploads a message, `db-a` starts and prepares
/// it with one reply. The process and the message.
async fn leave_ready_to_commit(admin: &Client, tokens: &Tokens) -> (ProcessId, MessageId) {
    let sent = admin
        .with_token(&tokens.phones[0])
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap()
        .accepted
        .id;
    let processor = admin.with_token(&tokens.db);
    let pid = processor
        .start(&start_request("db-a"))
        .await
        .unwrap()
        .process_id
        .unwrap();
    let prepared = processor
        .prepare(&pid, &prepare_all([sent], r#"{"ok":1}"#))
        .await
        .unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    (pid, sent)
}

/// Every message id in every folder of `mailboxes`, each found in one
/// place. A process found ready to commit goes in doubt by moves that run
/// just after the server is ready: a file they move between two listings
/// is listed twice, so the folders are listed again until no id repeats;
/// a message that stays in two places fails.
async fn every_id_once(admin: &Client, mailboxes: &[&str]) -> HashSet<MessageId> {
    let began = std::time::Instant::now();
    loop {
        let mut ids = Vec::new();
        for mailbox in mailboxes {
            for folder in Folder::ALL {
                let listing = admin.folder(&id(mailbox), folder).await.unwrap();
                ids.extend(listing.files.iter().map(|f| f.id));
            }
        }
        let once: HashSet<MessageId> = ids.iter().copied().collect();
        if once.len() == ids.len() {
            return once;
        }
        assert!(
            began.elapsed() < PATIENCE,
            "a message is in two places: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every file under `root` whose name holds `id`: where a message is, or
/// was left, in a data folder (for a failure's message).
fn files_of(root: &Path, id: &MessageId) -> Vec<std::path::PathBuf> {
    let id = id.to_string();
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if entry.file_name().to_string_lossy().contains(&id) {
                found.push(path);
            }
        }
    }
    found
}

/// Ids a test's clients noted, shared with the tasks that note them and
/// those that wait for them.
#[derive(Clone)]
struct Noted(Arc<watch::Sender<Vec<MessageId>>>);

impl Noted {
    fn new() -> Noted {
        Noted(Arc::new(watch::Sender::new(Vec::new())))
    }

    fn push(&self, ids: impl IntoIterator<Item = MessageId>) {
        self.0.send_modify(|noted| noted.extend(ids));
    }

    /// What was noted so far.
    fn now(&self) -> Vec<MessageId> {
        self.0.borrow().clone()
    }

    /// How many ids were noted so far.
    fn count(&self) -> usize {
        self.0.borrow().len()
    }

    /// Waits until `n` ids are noted, at most for [`PATIENCE`].
    async fn wait_for(&self, n: usize) {
        let mut noted = self.0.subscribe();
        tokio::time::timeout(PATIENCE, noted.wait_for(|ids| ids.len() >= n))
            .await
            .expect("the calls are not answered")
            .unwrap();
    }
}

/// Each of `phones` uploads to `to` without pause until `stop`, noting
/// each id in `acknowledged` once the upload is answered.
fn upload_until(
    phones: impl Iterator<Item = Client>,
    to: &'static str,
    acknowledged: &Noted,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    phones
        .map(|phone| {
            let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.is_cancelled() {
                    n += 1;
                    let body = format!(r#"{{"n":{n}}}"#);
                    let sent = phone.send(&message(to, &body, None)).await.unwrap();
                    acknowledged.push([sent.accepted.id]);
                }
            })
        })
        .collect()
}

/// Runs `estafeta check` on the data folder `data`, as README's restore
/// does: it must pass. Its report.
async fn check(cwd: &Path, data: &Path) -> String {
    let checked = estafeta(cwd)
        .arg("check")
        .env("ESTAFETA_DATA_DIR", data)
        .output()
        .await
        .unwrap();
    let report = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(checked.status.success(), "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_devices_upload_serves_every_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let copy = dir.path().join("copy");
    let (server, admin) = serve(dir.path(), &data).await;
    let tokens = provision(&admin).await;
    // A deleted device: its tombstone goes with the backup.
    let deleted = id("phone-9");
    admin
        .create_device(&id("acme"), &deleted, &id("sales"))
        .await
        .unwrap();
    admin.delete_device(&deleted, false).await.unwrap();
    let (pid, in_process) = leave_ready_to_commit(&admin, &tokens).await;

    // Two devices upload without pause; each id is noted once acknowledged.
    let acknowledged = Noted::new();
    let stop = CancellationToken::new();
    let phones = tokens.phones.iter().map(|t| admin.with_token(t));
    let uploaders = upload_until(phones, "db-a", &acknowledged, &stop);
    acknowledged.wait_for(20).await;

    let before = acknowledged.now();
    let (ok, out, err) = run_backup(dir.path(), &server.base, &copy).await;
    assert!(ok, "backup failed: {err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["files"].as_u64().unwrap() > 20, "{report}");
    assert!(report["paused_seconds"].as_f64().is_some(), "{report}");
    stop.cancel();
    for uploader in uploaders {
        uploader.await.unwrap();
    }
    let all: HashSet<MessageId> = acknowledged.now().into_iter().collect();
    assert!(
        all.len() > before.len(),
        "uploads went on during the backup"
    );
    server.kill9().await;
    let tombstone = DataLayout::new(&copy).removed().join("phone-9");
    assert!(tombstone.is_file(), "{} missing", tombstone.display());

    check(dir.path(), &copy).await;

    let (restored, admin) = serve(dir.path(), &copy).await;
    let found = every_id_once(&admin, &["db-a", "phone-1", "phone-2"]).await;
    for acked in before.iter().chain([&in_process]) {
        assert!(
            found.contains(acked),
            "{acked} acknowledged before the backup is missing; its files in the copy: {:?}, in the original: {:?}",
            files_of(&copy, acked),
            files_of(&data, acked)
        );
    }
    // Nothing in the copy that was never acknowledged (besides the reply
    // of the open process).
    let unknown = found
        .iter()
        .filter(|m| !all.contains(m) && **m != in_process)
        .count();
    assert!(unknown <= 1, "{unknown} messages nobody sent");

    // The same tenancy (the tokens work) and the process that was open
    // (ready to commit when the backup was made: in doubt after the start).
    let messages = listed(&admin, "db-a", Folder::Messages).await;
    assert!(messages.len() >= before.len());
    let status = admin.with_token(&tokens.db).process(&pid).await.unwrap();
    assert_eq!(status.state, ProcessState::InDoubt);
    admin
        .with_token(&tokens.phones[1])
        .send(&message("db-a", r#"{"after":1}"#, None))
        .await
        .unwrap();
    restored.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_backup_folders_are_refused_with_a_clear_error_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, admin) = serve(dir.path(), &data).await;
    let tokens = provision(&admin).await;
    let phone = admin.with_token(&tokens.phones[0]);
    phone
        .send(&message("db-a", r#"{"n":1}"#, None))
        .await
        .unwrap();

    // A folder that holds something.
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep.txt"), b"mine").unwrap();
    let (ok, _, err) = run_backup(dir.path(), &server.base, &full).await;
    assert!(!ok);
    assert!(
        err.contains("not_empty") && err.contains("not an empty folder"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&full).unwrap().collect();
    assert_eq!(left.len(), 1);
    assert_eq!(std::fs::read(full.join("keep.txt")).unwrap(), b"mine");

    // A folder that cannot be made: its parent is a file, or is missing.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for unwritable in [file.join("copy"), dir.path().join("missing/copy")] {
        let (ok, _, err) = run_backup(dir.path(), &server.base, &unwritable).await;
        assert!(!ok);
        assert!(
            err.contains("bad_path") && err.contains("cannot write"),
            "{err}"
        );
        assert!(!unwritable.exists());
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"x");

    // Inside the data folder.
    let inside = data.join("backup");
    let (ok, _, err) = run_backup(dir.path(), &server.base, &inside).await;
    assert!(!ok);
    assert!(err.contains("inside the data folder"), "{err}");
    assert!(!inside.exists());

    // Through the API: a relative path, and a token that is not the admin's.
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{}/v1/admin/backup", server.base))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"version": 1, "dir": "relative/copy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_path");
    assert!(!dir.path().join("relative").exists());
    let copy = dir.path().join("copy");
    let answer = http
        .post(format!("{}/v1/admin/backup", server.base))
        .bearer_auth(&tokens.db)
        .json(&serde_json::json!({"version": 1, "dir": copy}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    assert!(!copy.exists());

    // The server serves on, its messages where they were.
    let listing = listed(&admin, "db-a", Folder::Messages).await;
    assert_eq!(listing.len(), 1);
    phone
        .send(&message("db-a", r#"{"n":2}"#, None))
        .await
        .unwrap();
    server.terminate().await;
}

/// How many backups [`backups_copy_the_event_log_whole_while_it_is_written`]
/// takes, one after another, while the log is written.
const BACKUPS: usize = 4;

/// How much longer each read of the event log's file takes while the
/// backups copy it: with the file's 8 KiB reads, a copy of a few hundred
/// kilobytes lasts long enough for the log's writer (a batch a second
/// while records come) to commit a few times were it not held.
const SLOW_READ: Duration = Duration::from_millis(100);

/// How often a start of the database whose process stays open is answered
/// BUSY, a record each: often enough that every batch of the log's writer
/// has one, seldom enough that the log stays small.
const BUSY_EVERY: Duration = Duration::from_millis(40);

/// Every record of the event log under `data` (no server running on it):
/// the log must open as it is (nothing set aside), and every record must
/// read back, as many as the log counts, with as many bytes of JSON as it
/// counts.
fn whole_event_log(data: &Path) -> Vec<EventRecord> {
    let log = EventStore::open(&events_file(data)).unwrap();
    assert_eq!(
        log.take_set_aside(),
        None,
        "the copied event log was damaged"
    );
    let mut records = Vec::new();
    let mut before = None;
    loop {
        let page = log.query(&EventFilter::default(), before, 10_000).unwrap();
        records.extend(page.records);
        match page.next {
            Some(last) => before = parse_key(&last),
            None => break,
        }
    }
    let (count, bytes) = log.size().unwrap();
    assert_eq!(records.len() as u64, count, "records that do not read back");
    let json: usize = records
        .iter()
        .map(|r| serde_json::to_vec(r).unwrap().len())
        .sum();
    assert_eq!(json as u64, bytes, "the log's byte count disagrees");
    records
}

/// Backups taken one after another while clients keep the event log busy
/// (a database's starts answered BUSY, a record each, which a backup's
/// pause of durable writes does not hold back; uploads and processes of
/// another database), each copy of the log slowed down as on a slow disk
/// ([`SlowReads`]): each copy passes `estafeta check`; a server started on
/// it opens its event log without setting it aside; after it stops, every
/// record of the log reads back, the history from before the backups is
/// there, and nothing says the log was damaged; and the copy serves every
/// message acknowledged, and shows every process committed, before its
/// backup began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_copy_the_event_log_whole_while_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The history: the tenancy made, in the log once the server stopped.
    let (server, admin) = serve(dir.path(), &data).await;
    let tokens = provision(&admin).await;
    assert_eq!(server.terminate().await, Some(0));

    let (server, admin) = serve(dir.path(), &data).await;
    let pid = server.child.id().unwrap();
    leave_ready_to_commit(&admin, &tokens).await;
    let _slow = SlowReads::attach(pid, &events_file(&data), SLOW_READ).await;
    let stop = CancellationToken::new();
    let acknowledged = Noted::new();
    let phones = tokens.phones.iter().map(|t| admin.with_token(t));
    let mut load = upload_until(phones, "db-b", &acknowledged, &stop);
    let committed = Noted::new();
    let (db_b, halt) = (admin.with_token(&tokens.db_b), stop.clone());
    let (uploaded, done) = (acknowledged.clone(), committed.clone());
    load.push(tokio::spawn(async move {
        while !halt.is_cancelled() {
            let seen = uploaded.count();
            let started = db_b.start(&start_request("db-b")).await.unwrap();
            let (Some(pid), Some(messages)) = (started.process_id, started.messages) else {
                // Nothing waits: on once the next upload is answered.
                tokio::select! {
                    () = uploaded.wait_for(seen + 1) => {}
                    () = halt.cancelled() => {}
                }
                continue;
            };
            let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
            process_all(&db_b, &pid, ids.iter().copied(), "{}").await;
            done.push(ids);
        }
    }));
    // A record at every BUSY_EVERY, even while a backup holds back durable
    // writes.
    let (db_a, halt) = (admin.with_token(&tokens.db), stop.clone());
    load.push(tokio::spawn(async move {
        let mut pace = tokio::time::interval(BUSY_EVERY);
        while !halt.is_cancelled() {
            pace.tick().await;
            let started = db_a.start(&start_request("db-a")).await.unwrap();
            assert_eq!(started.status, StartStatus::Busy);
        }
    }));

    let mut copies = Vec::new();
    for n in 0..BACKUPS {
        // Uploads and processes go on between the backups.
        committed.wait_for(committed.count() + 5).await;
        let copy = dir.path().join(format!("copy-{n}"));
        let before = (acknowledged.now(), committed.now());
        let (ok, out, err) = run_backup(dir.path(), &server.base, &copy).await;
        assert!(ok, "backup {n} failed: {err}");
        // The copy of the log went by slowed reads of 8 KiB: without them
        // the test would be of a copy too quick to tear.
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        let reads = std::fs::metadata(events_file(&copy))
            .unwrap()
            .len()
            .div_ceil(8192);
        let slowed = SLOW_READ.as_secs_f64() * reads as f64;
        assert!(
            report["paused_seconds"].as_f64().unwrap() >= slowed,
            "{report}"
        );
        copies.push((copy, before));
    }
    stop.cancel();
    for task in load {
        task.await.unwrap();
    }
    server.kill9().await;

    for (copy, (acknowledged, committed)) in copies {
        check(dir.path(), &copy).await;
        let (restored, admin) = serve(dir.path(), &copy).await;
        let aside: Vec<_> = std::fs::read_dir(DataLayout::new(&copy).state_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains("damaged"))
            .collect();
        assert!(aside.is_empty(), "{}: set aside {aside:?}", copy.display());
        let found = every_id_once(&admin, &["db-b", "phone-1", "phone-2"]).await;
        for acked in &acknowledged {
            assert!(
                found.contains(acked),
                "{acked} acknowledged before is missing"
            );
        }
        let log = admin.folder(&id("db-b"), Folder::Log).await.unwrap();
        let logged: HashSet<MessageId> = log.files.iter().map(|f| f.id).collect();
        for done in &committed {
            assert!(
                logged.contains(done),
                "{done} committed before is not in Log"
            );
        }
        assert_eq!(restored.terminate().await, Some(0));
        let records = whole_event_log(&copy);
        assert!(
            records.iter().any(|r| r.text == "database created"),
            "{}: the history from before the backups is gone",
            copy.display()
        );
        assert!(
            records
                .iter()
                .all(|r| !r.text.contains("event log was damaged")),
            "{}",
            copy.display()
        );
    }
}
