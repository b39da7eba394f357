//! The index of waiting messages against the files, on the real binary:
//! files added or removed by hand are seen, and a `kill -9` between a
//! message's file and its index entry (at the mailbox's failpoints, with
//! `--features failpoints`) is repaired at start-up: the listing and the
//! start hand out exactly the files on disk, and what the crash left half
//! written is swept.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{Binary, PATIENCE, id, message, provision_one, start_request, wait_ready};
use estafeta_client::Client;
use estafeta_exchange::MessageId;
use estafeta_exchange::mailbox::{FileName, Folder};
use estafeta_exchange::wire::{Body, Message, Version};

const ADMIN: &str = "index-admin-0123456789abcdef0123456789";

/// A server on one data folder, started and stopped as a test goes.
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        Site {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn queue(&self) -> PathBuf {
        self.data().join("db-a").join("Messages")
    }

    /// The binary on this folder with `env` added; `ready` waits for
    /// `/readyz`.
    async fn serve(&self, env: &[(&str, &str)], ready: bool) -> (Binary, Client) {
        let mut all = vec![("ESTAFETA_ADMIN_TOKEN", ADMIN)];
        all.extend_from_slice(env);
        let server = Binary::serve(self.dir.path(), &self.data(), &[], &all).await;
        let admin = Client::new(&server.base, ADMIN).unwrap();
        if ready {
            wait_ready(&admin).await;
        }
        (server, admin)
    }

    /// The message files in `db-a/Messages` on disk, by id.
    fn on_disk(&self) -> Vec<MessageId> {
        let mut ids: Vec<MessageId> = entries(&self.queue())
            .iter()
            .filter_map(|n| n.parse::<FileName>().ok())
            .map(|n| n.id)
            .collect();
        ids.sort();
        ids
    }

    /// The hidden files in `db-a/Messages` but for spares not taken: the
    /// temporary files of writes.
    #[cfg(feature = "failpoints")]
    fn hidden(&self) -> Vec<String> {
        let queue = self.queue();
        entries(&queue)
            .into_iter()
            .filter(|n| n.starts_with('.'))
            .filter(|n| {
                let len = std::fs::metadata(queue.join(n)).map_or(1, |m| m.len());
                !estafeta_exchange::mailbox::is_idle_spare(n, len)
            })
            .collect()
    }

    /// A message from `phone-1` put into `db-a/Messages` by hand.
    fn put_by_hand(&self, seq: u64) -> MessageId {
        let m = Message {
            version: Version,
            id: MessageId::from_parts(1_764_064_800_000 + seq, u128::from(seq)),
            from: id("phone-1"),
            to: id("db-a"),
            subsystem: id("sales"),
            created_at: estafeta_exchange::Timestamp::from_millis(1_764_064_800_000),
            body: Body::from_json(r#"{"by":"hand"}"#).unwrap(),
        };
        let path = self.queue().join(FileName::of(&m).to_string());
        std::fs::write(path, m.to_file_bytes().unwrap()).unwrap();
        m.id
    }

    fn remove_by_hand(&self, gone: MessageId) {
        for name in entries(&self.queue()) {
            if name.parse::<FileName>().is_ok_and(|n| n.id == gone) {
                std::fs::remove_file(self.queue().join(name)).unwrap();
            }
        }
    }
}

fn entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The ids the admin listing of `db-a/Messages` shows, sorted.
async fn queued(admin: &Client) -> Vec<MessageId> {
    let mut ids = common::listed(admin, "db-a", Folder::Messages).await;
    ids.sort();
    ids
}

/// The ids a start of `db-a` hands out (the process is rolled back again).
async fn started(processor: &Client) -> Vec<MessageId> {
    let s = processor.start(&start_request("db-a")).await.unwrap();
    let Some(pid) = s.process_id else {
        return Vec::new();
    };
    let mut ids: Vec<MessageId> = s.messages.unwrap().iter().map(|m| m.id).collect();
    ids.sort();
    processor.rollback(&pid, "looked").await.unwrap();
    ids
}

/// Uploads `n` messages from the device to `db-a`.
async fn upload(device: &Client, n: usize) -> Vec<MessageId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let body = format!(r#"{{"n":{i}}}"#);
        ids.push(
            device
                .send(&message("db-a", &body, None))
                .await
                .unwrap()
                .accepted
                .id,
        );
    }
    ids
}

#[tokio::test]
async fn files_added_or_removed_by_hand_while_stopped_are_seen_at_once() {
    let site = Site::new();
    let (server, admin) = site.serve(&[], true).await;
    let (db, phone) = provision_one(&admin).await;
    let sent = upload(&admin.with_token(&phone), 3).await;
    // The index of db-a/Messages is in use before the stop.
    assert_eq!(queued(&admin).await, sent);
    assert_eq!(server.terminate().await, Some(0));

    site.remove_by_hand(sent[1]);
    let added = site.put_by_hand(7);
    let (server, admin) = site.serve(&[], true).await;
    let mut expected = vec![sent[0], sent[2], added];
    expected.sort();
    assert_eq!(site.on_disk(), expected);
    assert_eq!(queued(&admin).await, expected);
    assert_eq!(started(&admin.with_token(&db)).await, expected);
    assert_eq!(server.terminate().await, Some(0));
}

#[tokio::test]
async fn files_added_or_removed_by_hand_while_serving_are_seen() {
    let site = Site::new();
    let (server, admin) = site.serve(&[], true).await;
    let (db, phone) = provision_one(&admin).await;
    let sent = upload(&admin.with_token(&phone), 3).await;
    let processor = admin.with_token(&db);
    assert_eq!(started(&processor).await, sent);

    // A file removed by hand: the next start skips it, and the listing
    // forgets it.
    site.remove_by_hand(sent[0]);
    assert_eq!(started(&processor).await, sent[1..]);
    assert_eq!(queued(&admin).await, sent[1..]);

    // A file added by hand: seen once the background check of the folder
    // (every 10 s) has run.
    let added = site.put_by_hand(7);
    let mut expected = vec![added, sent[1], sent[2]];
    expected.sort();
    let began = Instant::now();
    while queued(&admin).await != expected {
        assert!(
            began.elapsed() < PATIENCE,
            "the file added by hand was not seen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(started(&processor).await, expected);
    assert_eq!(server.terminate().await, Some(0));
}

/// An upload killed at `point` (the first time it passes it), then a
/// normal start: the listing and a start show exactly the message files on
/// disk, and no temporary file is left once the start-up tidying has run.
/// Whether the killed upload's message is on disk is what the point says.
#[cfg(feature = "failpoints")]
async fn killed_during_an_upload_at(point: &str, message_on_disk: bool) {
    let site = Site::new();
    let (server, admin) = site.serve(&[], true).await;
    let (db, phone) = provision_one(&admin).await;
    let before = upload(&admin.with_token(&phone), 2).await;
    assert_eq!(server.terminate().await, Some(0));

    // Armed from the start; the upload is the first to pass the point
    // (start-up writes no message file).
    let (mut server, admin) = site.serve(&[("ESTAFETA_CRASH_AT", point)], true).await;
    let lost = admin
        .with_token(&phone)
        .send(&message("db-a", r#"{"n":"killed"}"#, None))
        .await;
    assert!(lost.is_err(), "{point}: the upload was answered: {lost:?}");
    let status = server.child.wait().await.unwrap();
    assert!(!status.success(), "{point}: {status:?}");

    let on_disk = site.on_disk();
    let killed: Vec<_> = on_disk
        .iter()
        .filter(|id| !before.contains(id))
        .copied()
        .collect();
    assert_eq!(
        killed.len(),
        usize::from(message_on_disk),
        "{point}: {on_disk:?}"
    );
    if !message_on_disk {
        assert_eq!(site.hidden().len(), 1, "{point}: the temporary file stays");
    }

    let (server, admin) = site.serve(&[], true).await;
    assert_eq!(queued(&admin).await, on_disk, "{point}");
    assert_eq!(started(&admin.with_token(&db)).await, on_disk, "{point}");
    let began = Instant::now();
    while !site.hidden().is_empty() {
        assert!(
            began.elapsed() < PATIENCE,
            "{point}: {:?} left",
            site.hidden()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The repaired index goes on as usual.
    let after = upload(&admin.with_token(&phone), 1).await;
    let mut expected = [on_disk, after].concat();
    expected.sort();
    assert_eq!(queued(&admin).await, expected, "{point}");
    assert_eq!(server.terminate().await, Some(0));
}

/// Killed with the message written and fsynced under its temporary name,
/// before the rename: no message, and the temporary file is swept.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn killed_before_the_rename_lists_nothing_and_sweeps_the_temporary_file() {
    killed_during_an_upload_at("mailbox::rename", false).await;
}

/// Killed with the file renamed into `Messages` but neither its folder
/// fsynced nor its index entry made: the file is listed after the restart.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn killed_before_the_folder_fsync_lists_the_file() {
    killed_during_an_upload_at("mailbox::dir_fsync", true).await;
}

/// Killed with the file durable but its index entry not made (nor the
/// upload answered): the file is listed after the restart.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn killed_before_the_index_entry_lists_the_file() {
    killed_during_an_upload_at("mailbox::synced", true).await;
}
