//! `estafeta backup DIR` against the real binary while devices upload: the
//! copy passes `estafeta check`, and a server started on it serves the same
//! tenancy, every message acknowledged before the backup began (each in one
//! place only) and the process that was open. Bad folders are refused with
//! a clear error and change nothing.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::{Binary, PATIENCE, estafeta, id, message, start_request, wait_ready};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{
    Body, MessageResult, PrepareRequest, ProcessState, Reply, ResultStatus, Version,
};
use estafeta_exchange::{DataLayout, MessageId};
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "backup-admin-0123456789abcdef0123456789";

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

/// Tokens of enterprise `acme`'s database `db-a` and devices `phone-1`
/// and `phone-2` (subsystem `sales`).
struct Tokens {
    db: String,
    phones: [String; 2],
}

async fn provision(admin: &Client) -> Tokens {
    admin.create_enterprise(&id("acme")).await.unwrap();
    admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db = admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap();
    let device = |name: &'static str| async move {
        admin
            .create_device(&id("acme"), &id(name), &id("sales"))
            .await
            .unwrap()
            .token
    };
    Tokens {
        db: db.token,
        phones: [device("phone-1").await, device("phone-2").await],
    }
}

/// Every message id in every folder of `mailboxes`, with repeats.
async fn every_id(admin: &Client, mailboxes: &[&str]) -> Vec<MessageId> {
    let mut ids = Vec::new();
    for mailbox in mailboxes {
        for folder in Folder::ALL {
            let listing = admin.folder(&id(mailbox), folder).await.unwrap();
            ids.extend(listing.files.iter().map(|f| f.id));
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_devices_upload_serves_every_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let copy = dir.path().join("copy");
    let env = [("ESTAFETA_ADMIN_TOKEN", ADMIN)];
    let server = Binary::serve(dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, ADMIN).unwrap();
    wait_ready(&admin).await;
    let tokens = provision(&admin).await;
    // A deleted device: its tombstone goes with the backup.
    let deleted = id("phone-9");
    admin
        .create_device(&id("acme"), &deleted, &id("sales"))
        .await
        .unwrap();
    admin.delete_device(&deleted, false).await.unwrap();
    // A process left READY_TO_COMMIT: one message, one reply.
    let in_process = admin
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
    let prepare = PrepareRequest {
        version: Version,
        results: vec![MessageResult {
            message_id: in_process,
            status: ResultStatus::Processed,
            error_code: None,
            error_text: None,
        }],
        replies: vec![Reply {
            to: id("phone-1"),
            body: Body::from_json(r#"{"ok":1}"#).unwrap(),
            created_at: None,
            deliver_at: None,
        }],
    };
    processor.prepare(&pid, &prepare).await.unwrap();

    // Two devices upload without pause; each id is noted once acknowledged.
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let uploaders: Vec<_> = tokens
        .phones
        .iter()
        .map(|token| {
            let phone = admin.with_token(token);
            let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.is_cancelled() {
                    n += 1;
                    let body = format!(r#"{{"n":{n}}}"#);
                    let sent = phone.send(&message("db-a", &body, None)).await.unwrap();
                    acknowledged.lock().unwrap().push(sent.accepted.id);
                }
            })
        })
        .collect();
    let began = std::time::Instant::now();
    while acknowledged.lock().unwrap().len() < 20 {
        assert!(began.elapsed() < PATIENCE, "the uploads are not answered");
        tokio::task::yield_now().await;
    }

    let before: Vec<MessageId> = acknowledged.lock().unwrap().clone();
    let (ok, out, err) = run_backup(dir.path(), &server.base, &copy).await;
    assert!(ok, "backup failed: {err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["files"].as_u64().unwrap() > 20, "{report}");
    assert!(report["paused_seconds"].as_f64().is_some(), "{report}");
    stop.cancel();
    for uploader in uploaders {
        uploader.await.unwrap();
    }
    let all: HashSet<MessageId> = acknowledged.lock().unwrap().iter().copied().collect();
    assert!(
        all.len() > before.len(),
        "uploads went on during the backup"
    );
    server.kill9().await;
    let tombstone = DataLayout::new(&copy).removed().join("phone-9");
    assert!(tombstone.is_file(), "{} missing", tombstone.display());

    let checked = estafeta(dir.path())
        .arg("check")
        .env("ESTAFETA_DATA_DIR", &copy)
        .output()
        .await
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );

    let restored = Binary::serve(dir.path(), &copy, &[], &env).await;
    let admin = Client::new(&restored.base, ADMIN).unwrap();
    wait_ready(&admin).await;
    let ids = every_id(&admin, &["db-a", "phone-1", "phone-2"]).await;
    let found: HashSet<MessageId> = ids.iter().copied().collect();
    assert_eq!(found.len(), ids.len(), "a message is in two places");
    for acked in before.iter().chain([&in_process]) {
        assert!(
            found.contains(acked),
            "{acked} acknowledged before the backup is missing"
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
    let messages = admin.folder(&id("db-a"), Folder::Messages).await.unwrap();
    assert!(messages.files.len() >= before.len());
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
    let env = [("ESTAFETA_ADMIN_TOKEN", ADMIN)];
    let server = Binary::serve(dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, ADMIN).unwrap();
    wait_ready(&admin).await;
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
    let listing = admin.folder(&id("db-a"), Folder::Messages).await.unwrap();
    assert_eq!(listing.files.len(), 1);
    phone
        .send(&message("db-a", r#"{"n":2}"#, None))
        .await
        .unwrap();
    server.terminate().await;
}
