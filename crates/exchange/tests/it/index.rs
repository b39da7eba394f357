//! The folder indexes against real files: built at first use, kept by the
//! mailboxes' own changes, and checked against the directories so that files
//! added or removed by hand are seen.

use std::time::Duration;

use crate::common::{Data, id, message, sized};
use estafeta_exchange::mailbox::{FileName, Folder, Limits, Location, SyncConfig};
use estafeta_exchange::wire::Message;

/// Puts a message file into a folder by hand, as an operator would.
fn by_hand(data: &Data, loc: &Location, m: &Message) -> FileName {
    let dir = data.mailboxes.path(loc);
    std::fs::create_dir_all(&dir).unwrap();
    let name = FileName::of(m);
    std::fs::write(dir.join(name.to_string()), m.to_file_bytes().unwrap()).unwrap();
    name
}

fn on_disk(data: &Data, loc: &Location) -> Vec<FileName> {
    let mut names: Vec<FileName> = data
        .raw_entries(loc)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    names.sort();
    names
}

/// The names a start would be handed from `loc`, with no filter and the
/// default limits.
async fn chosen(data: &Data, loc: &Location) -> Vec<FileName> {
    let entries = data.unfiltered(loc, Limits::default()).await;
    entries.into_iter().map(|e| e.name).collect()
}

#[tokio::test]
async fn files_there_before_the_first_use_are_listed() {
    let data = Data::new().await;
    let queue = Location::new(id("db-a"), Folder::Messages);
    let names: Vec<_> = (0..3)
        .map(|i| by_hand(&data, &queue, &sized(i, 10)))
        .collect();
    assert_eq!(data.mailboxes.count(&queue).await.unwrap(), 3);
    assert_eq!(data.mailboxes.list_names(&queue).await.unwrap(), names);
    let listed = data.mailboxes.list(&queue).await.unwrap();
    for entry in &listed {
        let path = data.mailboxes.path(&queue).join(entry.name.to_string());
        assert_eq!(entry.size, std::fs::metadata(path).unwrap().len());
    }
}

#[tokio::test]
async fn a_file_added_or_removed_by_hand_is_seen_after_the_verification() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let written: Vec<_> = data
        .mailboxes
        .write_all(&queue, &[sized(1, 10), sized(2, 10), sized(3, 10)])
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(data.mailboxes.list_names(&queue).await.unwrap(), written);

    // By hand: one file added (the oldest of all), one removed.
    let added = by_hand(&data, &queue, &sized(0, 10));
    let removed = &written[1];
    std::fs::remove_file(data.mailboxes.path(&queue).join(removed.to_string())).unwrap();
    // Listings come from the index, which has not looked yet.
    assert_eq!(data.mailboxes.list_names(&queue).await.unwrap(), written);

    assert_eq!(data.mailboxes.verify().await.unwrap(), 1);
    let expected = vec![added.clone(), written[0].clone(), written[2].clone()];
    assert_eq!(data.mailboxes.list_names(&queue).await.unwrap(), expected);
    assert_eq!(data.mailboxes.count(&queue).await.unwrap(), 3);
    assert_eq!(data.mailboxes.oldest(&queue, 1).await.unwrap(), vec![added]);
    let chosen = chosen(&data, &queue).await;
    assert_eq!(chosen, expected);
    assert_eq!(on_disk(&data, &queue), expected);
    // Nothing read since: nothing to check.
    assert_eq!(data.mailboxes.verify().await.unwrap(), 1);
    assert_eq!(data.mailboxes.verify().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_background_check_runs_every_verify_every() {
    let data = Data::with_config(SyncConfig {
        verify_every: Duration::from_secs(10),
        ..SyncConfig::default()
    })
    .await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let first = data.mailboxes.write(&queue, &sized(1, 10)).await.unwrap();
    assert_eq!(data.mailboxes.count(&queue).await.unwrap(), 1);
    let added = by_hand(&data, &queue, &sized(0, 10));
    assert_eq!(data.mailboxes.count(&queue).await.unwrap(), 1);
    // The paused clock moves on only when every task, blocking ones
    // included, waits: the check that falls due runs to its end.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        data.mailboxes.list_names(&queue).await.unwrap(),
        vec![added, first.name]
    );
}

#[tokio::test]
async fn a_start_skips_a_file_removed_by_hand_and_the_index_forgets_it() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    // In use before the writes (a selection builds the index even of a
    // folder not made yet), so their sizes are known and not looked up.
    assert_eq!(chosen(&data, &queue).await, vec![]);
    let entries = data
        .mailboxes
        .write_all(&queue, &[sized(1, 10), sized(2, 10)])
        .await
        .unwrap();
    std::fs::remove_file(
        data.mailboxes
            .path(&queue)
            .join(entries[0].name.to_string()),
    )
    .unwrap();
    let chosen = chosen(&data, &queue).await;
    assert_eq!(chosen.len(), 2, "not checked yet");
    let raw = data.mailboxes.read_array(&queue, &chosen).await.unwrap();
    assert_eq!(raw.names, vec![entries[1].name.clone()]);
    assert_eq!(
        data.mailboxes.list_names(&queue).await.unwrap(),
        vec![entries[1].name.clone()]
    );
}

#[tokio::test]
async fn sizes_and_filters_come_from_the_index() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let a = message("phone-1", "db-a", "sales", 1, 1, 1, "1");
    let b = message("phone-2", "db-a", "stock", 2, 2, 2, "2");
    let c = message("phone-1", "db-a", "stock", 3, 3, 3, "3");
    data.write_each(&queue, [&a, &b, &c]).await;
    assert_eq!(
        data.selected(&queue, Some(&["stock"]), None).await,
        vec![b.id, c.id]
    );
    assert_eq!(
        data.selected(&queue, None, Some(&["phone-1"])).await,
        vec![a.id, c.id]
    );
    assert_eq!(
        data.selected(&queue, Some(&["stock"]), Some(&["phone-1"]))
            .await,
        vec![c.id]
    );
    assert_eq!(data.selected(&queue, Some(&[]), None).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_matches_the_folders_after_concurrent_changes_and_checks() {
    let data = Data::new().await;
    let queue = data.folder("db-a", Folder::Messages).await;
    let log = Location::new(id("db-a"), Folder::Log);
    // Both indexes in use from the start, so that checks run throughout.
    assert_eq!(data.mailboxes.count(&queue).await.unwrap(), 0);
    assert_eq!(data.mailboxes.count(&log).await.unwrap(), 0);

    let mut workers = tokio::task::JoinSet::new();
    for w in 0..4u128 {
        let (mailboxes, queue, log) = (data.mailboxes.clone(), queue.clone(), log.clone());
        workers.spawn(async move {
            for i in 0..50u128 {
                let m = sized(w * 1_000 + i, 10);
                let entry = mailboxes.write(&queue, &m).await.unwrap();
                match i % 3 {
                    0 => {
                        mailboxes
                            .move_file(&entry.name, &queue, &log)
                            .await
                            .unwrap();
                    }
                    1 => {
                        mailboxes.delete(&queue, &entry.name).await.unwrap();
                    }
                    _ => {}
                }
            }
        });
    }
    let checker = {
        let mailboxes = data.mailboxes.clone();
        let (queue, log) = (queue.clone(), log.clone());
        tokio::spawn(async move {
            for _ in 0..30 {
                mailboxes.count(&queue).await.unwrap();
                mailboxes.count(&log).await.unwrap();
                mailboxes.verify().await.unwrap();
            }
        })
    };
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }
    checker.await.unwrap();
    for loc in [&queue, &log] {
        assert_eq!(
            data.mailboxes.list_names(loc).await.unwrap(),
            on_disk(&data, loc),
            "{loc}"
        );
    }
    assert_eq!(data.mailboxes.count(&queue).await.unwrap(), 4 * 16);
    assert_eq!(data.mailboxes.count(&log).await.unwrap(), 4 * 17);
}
