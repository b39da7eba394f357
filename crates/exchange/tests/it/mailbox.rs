//! The mailboxes on real files in a temporary folder.

use std::collections::HashSet;

use crate::common::{Data, id, message, patient, sized};
use estafeta_exchange::mailbox::{FileName, Folder, Limits, Location, MB, Outcome};
use estafeta_exchange::wire::{Inbox, Message, StartResponse};
use estafeta_exchange::{MailboxError, MessageId, ProcessId, Timestamp};

#[tokio::test]
async fn listing_is_oldest_created_first_then_arrival() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    // Written out of order; created_at decides, then arrival (the id).
    let late = message("phone-1", "db-a", "sales", 5_000, 10, 1, "1");
    let early = message("phone-2", "db-a", "sales", 1_000, 30, 1, "2");
    let same_time_first = message("phone-3", "db-a", "sales", 3_000, 20, 1, "3");
    let same_time_second = message("phone-1", "db-a", "sales", 3_000, 21, 1, "4");
    data.write_each(&queue, [&late, &same_time_second, &early, &same_time_first])
        .await;
    let listed: Vec<_> = data.mailboxes.list(&queue).await.unwrap();
    let ids: Vec<_> = listed.iter().map(|e| e.name.id).collect();
    assert_eq!(
        ids,
        vec![early.id, same_time_first.id, same_time_second.id, late.id]
    );
    for entry in &listed {
        let on_disk = std::fs::metadata(data.mailboxes.path(&queue).join(entry.name.to_string()))
            .unwrap()
            .len();
        assert_eq!(entry.size, on_disk);
    }
    let names = data.mailboxes.list_names(&queue).await.unwrap();
    assert_eq!(
        names,
        listed.iter().map(|e| e.name.clone()).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn worst_case_name_fits_the_file_system() {
    let data = Data::new().await;
    let long = "a".repeat(64);
    let queue = data.folder(&long, Folder::Messages).await;
    let m = message(
        &long,
        &long,
        &long,
        Timestamp::MAX.as_millis(),
        u64::MAX >> 16,
        u128::MAX,
        "{}",
    );
    let entry = data.mailboxes.write(&queue, &m).await.unwrap();
    let text = entry.name.to_string();
    assert_eq!(text.len(), FileName::MAX_LEN);
    // The temporary name adds a dot and ".<run>.tmp" and must fit as well.
    assert!(text.len() + 10 <= 255, "{}", text.len());
    assert_eq!(
        data.mailboxes.list_names(&queue).await.unwrap(),
        vec![entry.name]
    );
}

#[tokio::test]
async fn select_filters_by_subsystem_and_sender() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let msgs = [
        message("phone-1", "db-a", "sales", 1, 1, 1, "1"),
        message("phone-2", "db-a", "sales", 2, 1, 2, "2"),
        message("phone-1", "db-a", "stock", 3, 1, 3, "3"),
        message("phone-2", "db-a", "stock", 4, 1, 4, "4"),
    ];
    data.write_each(&queue, &msgs).await;
    assert_eq!(
        data.selected(&queue, None, None).await,
        msgs.iter().map(|m| m.id).collect::<Vec<_>>()
    );
    assert_eq!(
        data.selected(&queue, Some(&["stock"]), None).await,
        vec![msgs[2].id, msgs[3].id]
    );
    assert_eq!(
        data.selected(&queue, None, Some(&["phone-2"])).await,
        vec![msgs[1].id, msgs[3].id]
    );
    assert_eq!(
        data.selected(&queue, Some(&["sales"]), Some(&["phone-2"]))
            .await,
        vec![msgs[1].id]
    );
    assert_eq!(
        data.selected(&queue, Some(&[]), None).await,
        Vec::<MessageId>::new()
    );
    assert_eq!(
        data.selected(&queue, Some(&["other"]), None).await,
        Vec::<MessageId>::new()
    );
}

#[tokio::test]
async fn select_respects_the_file_count_and_the_size_limit() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let mut ids = Vec::new();
    for seq in 0..6 {
        ids.push(
            data.mailboxes
                .write(&queue, &sized(seq, 1_000))
                .await
                .unwrap(),
        );
    }
    let size = ids[0].size;

    let by_count = Limits::default().narrow(Some(4), None).unwrap();
    let got = data.unfiltered(&queue, by_count).await;
    assert_eq!(got, ids[..4].to_vec());

    // Room for two and a half files: two are sent.
    let by_size = Limits {
        max_files: 10,
        max_bytes: size * 5 / 2,
    };
    let got = data.unfiltered(&queue, by_size).await;
    assert_eq!(got, ids[..2].to_vec());
    assert!(got.iter().map(|e| e.size).sum::<u64>() <= by_size.max_bytes);

    // Exactly three files fit.
    let exact = Limits {
        max_files: 10,
        max_bytes: size * 3,
    };
    let got = data.unfiltered(&queue, exact).await;
    assert_eq!(got, ids[..3].to_vec());
}

#[tokio::test]
async fn a_single_oversized_message_is_still_sent_alone() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let big = data
        .mailboxes
        .write(&queue, &sized(0, 2 * MB as usize))
        .await
        .unwrap();
    let small = data.mailboxes.write(&queue, &sized(1, 10)).await.unwrap();
    let limits = Limits::default().narrow(None, Some(1.0)).unwrap();
    let got = data.unfiltered(&queue, limits).await;
    assert_eq!(got, vec![big.clone()]);
    // Once it is gone, the rest flows again.
    data.mailboxes.delete(&queue, &big.name).await.unwrap();
    let got = data.unfiltered(&queue, limits).await;
    assert_eq!(got, vec![small]);
}

#[tokio::test]
async fn raw_arrays_are_valid_json_equal_to_the_messages() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let msgs = vec![
        message(
            "phone-1",
            "db-a",
            "sales",
            1,
            1,
            1,
            r#"{"a": [1, 2, {"b": null}]}"#,
        ),
        message(
            "phone-2",
            "db-a",
            "sales",
            2,
            1,
            2,
            r#""text with \"quotes\" and ,]""#,
        ),
        message("phone-1", "db-a", "stock", 3, 1, 3, "  42  "),
    ];
    let written = data.mailboxes.write_all(&queue, &msgs).await.unwrap();
    assert_eq!(written.len(), 3);
    let names: Vec<_> = written.into_iter().map(|e| e.name).collect();
    let raw = data.mailboxes.read_array(&queue, &names).await.unwrap();
    assert_eq!(raw.names, names);
    let parsed: Vec<Message> = serde_json::from_slice(&raw.json).unwrap();
    assert_eq!(parsed, msgs);

    let pid = ProcessId::from_parts(9, 9);
    let start: StartResponse =
        serde_json::from_slice(&StartResponse::ok_json_from_raw(pid, &raw.json)).unwrap();
    assert_eq!(start.messages, Some(msgs.clone()));
    let inbox: Inbox = serde_json::from_slice(&Inbox::json_from_raw(&raw.json)).unwrap();
    assert_eq!(inbox.messages, msgs);

    // The empty array and a vanished file.
    let empty = data.mailboxes.read_array(&queue, &[]).await.unwrap();
    assert_eq!(empty.json, b"[]");
    data.mailboxes.delete(&queue, &names[1]).await.unwrap();
    let raw = data.mailboxes.read_array(&queue, &names).await.unwrap();
    assert_eq!(raw.names, vec![names[0].clone(), names[2].clone()]);
    let parsed: Vec<Message> = serde_json::from_slice(&raw.json).unwrap();
    assert_eq!(parsed, vec![msgs[0].clone(), msgs[2].clone()]);
}

#[tokio::test]
async fn a_damaged_file_is_an_error_not_a_broken_answer() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let entry = data.mailboxes.write(&queue, &sized(0, 10)).await.unwrap();
    std::fs::write(
        data.mailboxes.path(&queue).join(entry.name.to_string()),
        b"",
    )
    .unwrap();
    let err = data
        .mailboxes
        .read_array(&queue, &[entry.name])
        .await
        .unwrap_err();
    assert!(matches!(err, MailboxError::Corrupt(_)), "{err}");
}

#[tokio::test]
async fn moves_are_idempotent_and_cross_mailboxes() {
    let data = Data::new().await;
    let prepared = data.folder("db-a", Folder::Prepared).await;
    let inbox = data.folder("phone-1", Folder::Messages).await;
    let device_log = Location::new(id("phone-1"), Folder::Log);
    let reply = message("db-a", "phone-1", "sales", 1, 1, 1, r#"{"ok":true}"#);
    let entry = data.mailboxes.write(&prepared, &reply).await.unwrap();

    let mv = |from: &Location, to: &Location| {
        let (m, n, f, t) = (
            data.mailboxes.clone(),
            entry.name.clone(),
            from.clone(),
            to.clone(),
        );
        async move { m.move_file(&n, &f, &t).await }
    };
    assert_eq!(mv(&prepared, &inbox).await.unwrap(), Outcome::Done);
    assert_eq!(mv(&prepared, &inbox).await.unwrap(), Outcome::AlreadyDone);
    assert_eq!(data.mailboxes.list_names(&prepared).await.unwrap(), vec![]);
    assert_eq!(
        data.mailboxes.find(&inbox, reply.id).await.unwrap(),
        Some(entry.name.clone())
    );

    // Acknowledged: the device's inbox to the device's Log.
    assert_eq!(mv(&inbox, &device_log).await.unwrap(), Outcome::Done);
    assert_eq!(data.mailboxes.find(&inbox, reply.id).await.unwrap(), None);
    assert!(
        data.mailboxes
            .find(&device_log, reply.id)
            .await
            .unwrap()
            .is_some()
    );

    // In neither place: a typed NotFound.
    let err = mv(&prepared, &inbox).await.unwrap_err();
    assert!(matches!(err, MailboxError::NotFound { .. }), "{err}");

    // A target folder that cannot be made is a storage error and the file stays.
    std::fs::write(data.dir.path().join("data").join("nobody"), b"x").unwrap();
    let nowhere = Location::new(id("nobody"), Folder::Messages);
    let err = mv(&device_log, &nowhere).await.unwrap_err();
    assert!(matches!(err, MailboxError::Storage { .. }), "{err}");
    assert!(
        data.mailboxes
            .find(&device_log, reply.id)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn deletes_are_idempotent() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Prepared).await;
    let entry = data.mailboxes.write(&queue, &sized(0, 10)).await.unwrap();
    assert_eq!(
        data.mailboxes.delete(&queue, &entry.name).await.unwrap(),
        Outcome::Done
    );
    assert_eq!(
        data.mailboxes.delete(&queue, &entry.name).await.unwrap(),
        Outcome::AlreadyDone
    );
    assert!(data.raw_entries(&queue).is_empty());
}

#[tokio::test]
async fn a_failed_write_leaves_nothing_visible() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    // The folder's path is a file: creating the temporary file fails (ENOTDIR).
    let dir = data.mailboxes.path(&queue);
    std::fs::create_dir(dir.parent().unwrap()).unwrap();
    std::fs::write(&dir, b"not a folder").unwrap();
    let err = data
        .mailboxes
        .write(&queue, &sized(0, 10))
        .await
        .unwrap_err();
    assert!(matches!(err, MailboxError::Storage { .. }), "{err}");
    assert!(!err.is_storage_full());
    assert_eq!(std::fs::read(&dir).unwrap(), b"not a folder");
    // A mailbox whose path is a file.
    let squatted = Location::new(id("db-b"), Folder::Messages);
    let base = data.dir.path().join("data").join("db-b");
    std::fs::write(&base, b"not a folder").unwrap();
    assert!(data.mailboxes.create_mailbox(&id("db-b")).await.is_err());
    assert!(
        data.mailboxes
            .write(&squatted, &sized(1, 10))
            .await
            .is_err()
    );
    assert_eq!(std::fs::read(&base).unwrap(), b"not a folder");
}

#[tokio::test]
async fn a_failed_batch_write_removes_its_siblings() {
    let data = Data::new().await;
    let prepared = data.folder("db-a", Folder::Prepared).await;
    std::fs::create_dir_all(data.mailboxes.path(&prepared)).unwrap();
    let replies = [sized(0, 10), sized(1, 10), sized(2, 10)];
    // A folder squats the final name of the middle reply, so its rename fails.
    let squat = FileName::of(&replies[1]).to_string();
    std::fs::create_dir(data.mailboxes.path(&prepared).join(&squat)).unwrap();
    std::fs::write(data.mailboxes.path(&prepared).join(&squat).join("x"), b"x").unwrap();

    let err = data
        .mailboxes
        .write_all(&prepared, &replies)
        .await
        .unwrap_err();
    assert!(matches!(err, MailboxError::Storage { .. }), "{err}");
    // Only the squatter is left: no reply, no temporary file.
    assert_eq!(data.raw_entries(&prepared), vec![squat]);
}

#[tokio::test]
async fn full_disk_errors_are_classified() {
    let full = MailboxError::io("/x", std::io::Error::from(std::io::ErrorKind::StorageFull));
    assert!(full.is_storage_full());
    let other = MailboxError::io(
        "/x",
        std::io::Error::from(std::io::ErrorKind::PermissionDenied),
    );
    assert!(!other.is_storage_full());
}

#[tokio::test]
async fn retention_uses_arrival_time_and_spares_live_messages() {
    let data = Data::new().await;
    let log = data.folder("db-a", Folder::Log).await;
    // created_at says "ancient" for all; the ids say when they arrived.
    let old = message("phone-1", "db-a", "sales", 0, 1_000, 1, "1");
    let old_but_live = message("phone-1", "db-a", "sales", 0, 1_500, 2, "2");
    let young = message("phone-1", "db-a", "sales", 0, 9_000, 3, "3");
    data.write_each(&log, [&old, &old_but_live, &young]).await;
    let cutoff = Timestamp::from_millis(5_000);
    let expired: Vec<_> = data
        .mailboxes
        .older_than(&log, cutoff)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(expired, vec![old.id, old_but_live.id]);
    let keep = HashSet::from([old_but_live.id]);
    assert_eq!(
        data.mailboxes
            .remove_older_than(&log, cutoff, &keep)
            .await
            .unwrap(),
        1
    );
    let left: Vec<_> = data
        .mailboxes
        .list_names(&log)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(left, vec![old_but_live.id, young.id]);
}

#[tokio::test]
async fn temporary_and_foreign_files_are_not_listed_and_temp_files_are_swept() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let entry = data.mailboxes.write(&queue, &sized(0, 10)).await.unwrap();
    let dir = data.mailboxes.path(&queue);
    // Left by writes of earlier runs (the second of a server that named
    // its temporary files without a run).
    for stale in [
        format!(".{}.x-yz.tmp", FileName::of(&sized(1, 10))),
        format!(".{}.tmp", FileName::of(&sized(2, 10))),
    ] {
        std::fs::write(dir.join(stale), b"{").unwrap();
    }
    std::fs::write(dir.join("README.txt"), b"hello").unwrap();
    assert_eq!(
        data.mailboxes.list_names(&queue).await.unwrap(),
        vec![entry.name.clone()]
    );
    assert_eq!(
        data.mailboxes.sweep_temp_files(&id("db-a")).await.unwrap(),
        2
    );
    assert_eq!(
        data.mailboxes.sweep_temp_files(&id("db-a")).await.unwrap(),
        0
    );
    let mut expected = vec![entry.name.to_string(), "README.txt".to_owned()];
    expected.sort();
    assert_eq!(data.raw_entries(&queue), expected);
}

#[tokio::test]
async fn folders_are_made_when_their_first_file_arrives() {
    let data = Data::new().await;
    let db = id("db-a");
    data.mailboxes.create_mailbox(&db).await.unwrap();
    data.mailboxes.create_mailbox(&db).await.unwrap();
    let base = data.dir.path().join("data").join("db-a");
    assert!(!base.exists(), "an idle mailbox has nothing on disk");
    let queue = Location::new(db.clone(), Folder::Messages);
    let log = Location::new(db.clone(), Folder::Log);
    // Missing folders list as empty; deleting from one is already done.
    assert_eq!(data.mailboxes.list(&queue).await.unwrap(), vec![]);
    assert_eq!(data.mailboxes.count(&log).await.unwrap(), 0);
    let absent = FileName::of(&sized(9, 10));
    assert_eq!(
        data.mailboxes.delete(&queue, &absent).await.unwrap(),
        Outcome::AlreadyDone
    );
    assert!(!base.exists());

    let entry = data.mailboxes.write(&queue, &sized(0, 10)).await.unwrap();
    assert!(data.mailboxes.path(&queue).is_dir());
    assert!(!data.mailboxes.path(&log).exists());
    data.mailboxes
        .move_file(&entry.name, &queue, &log)
        .await
        .unwrap();
    let mut made: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    made.sort();
    assert_eq!(made, vec!["Log", "Messages"]);
    assert_eq!(
        data.mailboxes.list_names(&log).await.unwrap(),
        vec![entry.name]
    );
    data.mailboxes.create_mailbox(&db).await.unwrap();
}

#[tokio::test]
async fn many_moves_and_deletes_share_one_batch() {
    let data = Data::with_config(patient()).await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let log = Location::new(id("db-a"), Folder::Log);
    let msgs: Vec<_> = (0..20).map(|seq| sized(seq, 10)).collect();
    let names: Vec<_> = data
        .mailboxes
        .write_all(&queue, &msgs)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();

    let before = data.mailboxes.stats();
    let mut moves: Vec<_> = names
        .iter()
        .map(|n| (n.clone(), queue.clone(), log.clone()))
        .collect();
    let outcomes = data.mailboxes.move_all(&moves).await;
    assert!(outcomes.iter().all(|o| matches!(o, Ok(Outcome::Done))));
    let after = data.mailboxes.stats();
    assert_eq!(after.batches - before.batches, 1);
    assert_eq!(
        after.dir_fsyncs - before.dir_fsyncs,
        3,
        "the mailbox for the new Log, then source and target folder once each"
    );
    assert_eq!(data.mailboxes.list_names(&log).await.unwrap(), names);

    // Repeating is harmless; a file that is nowhere fails alone.
    moves.push((FileName::of(&sized(99, 10)), queue.clone(), log.clone()));
    let outcomes = data.mailboxes.move_all(&moves).await;
    assert!(
        outcomes[..20]
            .iter()
            .all(|o| matches!(o, Ok(Outcome::AlreadyDone)))
    );
    assert!(matches!(outcomes[20], Err(MailboxError::NotFound { .. })));

    let deleted = data.mailboxes.delete_all(&log, &names[..5]).await;
    assert!(deleted.iter().all(|o| matches!(o, Ok(Outcome::Done))));
    assert_eq!(
        data.mailboxes.list_names(&log).await.unwrap(),
        names[5..].to_vec()
    );
}
