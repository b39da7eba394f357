//! The behaviour every [`MessageStore`] and [`UploadKeys`] must show, as
//! checks any backend's tests run against a fresh store (feature
//! `test-support`): the embedded stores' own tests call them, and so do the
//! tests of other backends, so that one set of checks holds them to one
//! contract. A failed check panics with what differed.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;

use estafeta_durable::WriteGate;
use estafeta_repeat::RedbStore;
use estafeta_repeat::store::Read;

use super::scheduled::Scheduled;
use super::{
    FileEntry, FileName, FileStore, Filter, Folder, Limits, Location, MessageStore, Op, Outcome,
    scheduled_entry,
};
use crate::error::MailboxError;
use crate::id::Id;
use crate::keys::{KeyedUpload, UploadKeys};
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::{Body, Message, Version};

/// 2025-11-25T10:00:00Z: the arrival time (in the id) of the test messages.
const T0: u64 = 1_764_064_800_000;
/// A `deliver_at` far in the future (2100).
const FAR: i64 = 4_102_444_800_000;

fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

fn at(mailbox: &str, folder: Folder) -> Location {
    Location::new(id(mailbox), folder)
}

/// A message that arrived `seq` ms after [`T0`], created at `created`
/// (ms after T0), with a body of about `pad` bytes.
fn message(seq: u64, created: i64, from: &str, to: &str, subsystem: &str, pad: usize) -> Message {
    let t0 = i64::try_from(T0).unwrap();
    Message {
        version: Version,
        id: MessageId::from_parts(T0 + seq, u128::from(seq)),
        from: id(from),
        to: id(to),
        subsystem: id(subsystem),
        created_at: Timestamp::from_millis(t0 + created),
        body: Body::from_json(format!(r#"{{"n":{seq},"pad":"{}"}}"#, "x".repeat(pad))).unwrap(),
    }
}

fn names(entries: &[FileEntry]) -> Vec<FileName> {
    entries.iter().map(|e| e.name.clone()).collect()
}

fn name(m: &Message) -> FileName {
    FileName::of(m)
}

fn outcome(r: Result<Outcome, MailboxError>) -> Option<Outcome> {
    match r {
        Ok(o) => Some(o),
        Err(MailboxError::NotFound { .. }) => None,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The embedded message store under the folder `dir` (messages in
/// `dir/data`, kept-aside messages in `dir/scheduled.redb`, on the system
/// clock), as the exchange opens it, and the repeat store it schedules
/// messages in: for tests and benchmarks that hold another backend
/// to it.
pub async fn file_store(dir: &Path) -> (Arc<dyn MessageStore>, Arc<RedbStore>) {
    let scheduled = Arc::new(RedbStore::open(dir.join("scheduled.redb")).unwrap());
    let kept = Scheduled::new(scheduled.clone(), Arc::new(estafeta_session::SystemClock));
    let store = FileStore::open(&dir.join("data"), &kept, WriteGate::default())
        .await
        .unwrap();
    (Arc::new(store), scheduled)
}

/// Runs every check of the [`MessageStore`] contract on `store`, a fresh
/// store whose scheduled messages (by [`Op::Schedule`]) go to `kept`, the
/// repeat store of its scheduled-delivery scheduler.
pub async fn message_store_contract(
    store: &dyn MessageStore,
    kept: Arc<dyn estafeta_repeat::Store>,
) {
    // Messages are only for mailboxes that were made.
    for owner in [
        "read-db",
        "sel-db",
        "batch-db",
        "batch-phone",
        "dlv-db",
        "dlv-phone",
        "old-db",
        "phone-1",
        "phone-2",
    ] {
        store.create_mailbox(&id(owner)).await.unwrap();
    }
    select_takes_the_oldest_within_the_limits(store).await;
    reads_and_lookups(store).await;
    a_batch_is_idempotent(store, kept).await;
    delivered_and_put_again(store).await;
    retention_and_removal(store).await;
    a_removed_mailbox_takes_nothing_until_made_again(store).await;
    a_put_all_refused_its_go_ahead_leaves_nothing(store).await;
}

/// A go-ahead already given (the caller has nothing to overlap).
fn go() -> tokio::sync::oneshot::Receiver<bool> {
    let (go, when) = tokio::sync::oneshot::channel();
    let _ = go.send(true);
    when
}

/// `put_all` whose go-ahead answers `false`, or is dropped, makes nothing
/// appear and answers empty.
async fn a_put_all_refused_its_go_ahead_leaves_nothing(store: &dyn MessageStore) {
    let prepared = at("refused-db", Folder::Prepared);
    store.create_mailbox(&prepared.mailbox).await.unwrap();
    let ms = [message(41, 0, "refused-db", "phone-1", "sales", 0)];
    let (no, refused) = tokio::sync::oneshot::channel();
    no.send(false).unwrap();
    let (dropped, abandoned) = tokio::sync::oneshot::channel::<bool>();
    drop(dropped);
    for when in [refused, abandoned] {
        let written = store.put_all(&prepared, &ms, when).await.unwrap();
        assert!(written.is_empty(), "{written:?}");
    }
    assert_eq!(store.count(&prepared).await.unwrap(), 0);
    assert!(store.list(&prepared).await.unwrap().is_empty());
}

/// `put` and `select`: oldest `created_at` first, then arrival; the file
/// and byte limits; a message larger than the byte limit comes alone; the
/// sender and subsystem filters.
async fn select_takes_the_oldest_within_the_limits(store: &dyn MessageStore) {
    let queue = at("sel-db", Folder::Messages);
    store.create_mailbox(&queue.mailbox).await.unwrap();
    // Arrival order 1..5, creation order 3, 1, 4, 2, 5 (1 and 4 created at
    // the same time: arrival breaks the tie).
    let ms = [
        message(1, 20, "phone-1", "sel-db", "sales", 10),
        message(2, 40, "phone-2", "sel-db", "sales", 10),
        message(3, 10, "phone-1", "sel-db", "stock", 10),
        message(4, 20, "phone-2", "sel-db", "stock", 10),
        message(5, 50, "phone-1", "sel-db", "sales", 10),
    ];
    let mut sizes = Vec::new();
    for m in &ms {
        let entry = store.put(&queue, m).await.unwrap();
        assert_eq!(entry.name, name(m));
        assert_eq!(entry.size, m.to_file_bytes().unwrap().len() as u64);
        sizes.push(entry.size);
    }
    let order = [2, 0, 3, 1, 4].map(|i| name(&ms[i]));
    let all = Filter::default();
    let chosen = store.select(&queue, &all, Limits::default()).await.unwrap();
    assert_eq!(names(&chosen), order);
    assert_eq!(
        chosen.iter().map(|e| e.size).collect::<Vec<_>>(),
        [2, 0, 3, 1, 4].map(|i| sizes[i])
    );

    let two = Limits {
        max_files: 2,
        max_bytes: u64::MAX,
    };
    assert_eq!(
        names(&store.select(&queue, &all, two).await.unwrap()),
        order[..2]
    );
    // Bytes: exactly the first three fit; one byte less, two.
    let three = sizes[2] + sizes[0] + sizes[3];
    for (max_bytes, n) in [(three, 3), (three - 1, 2), (1, 1)] {
        let limits = Limits {
            max_files: 10,
            max_bytes,
        };
        let got = store.select(&queue, &all, limits).await.unwrap();
        assert_eq!(names(&got), order[..n], "max_bytes {max_bytes}");
    }

    let stock = Filter::new(Some(vec![id("stock")]), None);
    let got = store
        .select(&queue, &stock, Limits::default())
        .await
        .unwrap();
    assert_eq!(names(&got), [name(&ms[2]), name(&ms[3])]);
    let phone2 = Filter::new(None, Some(vec![id("phone-2")]));
    let got = store.select(&queue, &phone2, two).await.unwrap();
    assert_eq!(names(&got), [name(&ms[3]), name(&ms[1])]);
    let both = Filter::new(Some(vec![id("sales")]), Some(vec![id("phone-1")]));
    let got = store
        .select(&queue, &both, Limits::default())
        .await
        .unwrap();
    assert_eq!(names(&got), [name(&ms[0]), name(&ms[4])]);

    let empty = at("sel-none", Folder::Messages);
    assert!(
        store
            .select(&empty, &all, Limits::default())
            .await
            .unwrap()
            .is_empty()
    );
}

/// `read_array`, `count`, `oldest`, `find`, `find_all`, `list`, `put_all`.
async fn reads_and_lookups(store: &dyn MessageStore) {
    let prepared = at("read-db", Folder::Prepared);
    let ms = [
        message(11, 30, "read-db", "phone-1", "sales", 0),
        message(12, 10, "read-db", "phone-2", "sales", 5),
        message(13, 20, "read-db", "phone-1", "stock", 500),
    ];
    let written = store.put_all(&prepared, &ms, go()).await.unwrap();
    assert_eq!(names(&written), ms.iter().map(name).collect::<Vec<_>>());
    let missing = name(&message(19, 0, "read-db", "phone-1", "sales", 0));

    let raw = store
        .read_array(&prepared, &[name(&ms[2]), missing.clone(), name(&ms[0])])
        .await
        .unwrap();
    assert_eq!(raw.names, [name(&ms[2]), name(&ms[0])]);
    let mut json = b"[".to_vec();
    json.extend(ms[2].to_file_bytes().unwrap());
    json.push(b',');
    json.extend(ms[0].to_file_bytes().unwrap());
    json.push(b']');
    assert_eq!(raw.json, json);
    let none = store
        .read_array(&prepared, std::slice::from_ref(&missing))
        .await
        .unwrap();
    assert_eq!((none.json, none.names), (b"[]".to_vec(), vec![]));
    // Another folder of the same mailbox holds none of them.
    let log = at("read-db", Folder::Log);
    assert!(
        store
            .read_array(&log, &[name(&ms[0])])
            .await
            .unwrap()
            .names
            .is_empty()
    );

    assert_eq!(store.count(&prepared).await.unwrap(), 3);
    assert_eq!(store.count(&log).await.unwrap(), 0);
    let by_age = [name(&ms[1]), name(&ms[2]), name(&ms[0])];
    assert_eq!(store.oldest(&prepared, 2).await.unwrap(), by_age[..2]);
    assert_eq!(store.oldest(&prepared, 10).await.unwrap(), by_age);
    assert_eq!(
        store.find(&prepared, ms[2].id).await.unwrap(),
        Some(name(&ms[2]))
    );
    assert_eq!(store.find(&prepared, missing.id).await.unwrap(), None);
    assert_eq!(store.find(&log, ms[2].id).await.unwrap(), None);
    let wanted = HashSet::from([ms[0].id, ms[1].id, missing.id]);
    let mut found = store.find_all(&prepared, &wanted).await.unwrap();
    found.sort();
    let mut expected = vec![name(&ms[0]), name(&ms[1])];
    expected.sort();
    assert_eq!(found, expected);
    let listed = store.list(&prepared).await.unwrap();
    assert_eq!(names(&listed), by_age);
    assert_eq!(
        listed.iter().map(|e| e.size).collect::<Vec<_>>(),
        [1, 2, 0].map(|i| ms[i].to_file_bytes().unwrap().len() as u64)
    );
    assert!(store.list(&log).await.unwrap().is_empty());
}

/// `apply`: each op's result in the ops' order, arrivals, and a batch run
/// again (the lifecycle repeats a recorded batch after a crash): a move,
/// delete or schedule already done is `AlreadyDone` (a scheduled message
/// waiting in the scheduler or delivered), a message in none of an op's
/// places is `NotFound`; `delete_all` likewise.
async fn a_batch_is_idempotent(store: &dyn MessageStore, kept: Arc<dyn estafeta_repeat::Store>) {
    let db = "batch-db";
    let queue = at(db, Folder::Messages);
    let prepared = at(db, Folder::Prepared);
    let log = at(db, Folder::Log);
    let inbox = at("batch-phone", Folder::Messages);
    let upload = message(21, 0, "batch-phone", db, "sales", 0);
    let [now, gone, later, past] =
        [22, 23, 24, 25].map(|seq| message(seq, 0, db, "batch-phone", "sales", 0));
    store.put(&queue, &upload).await.unwrap();
    store
        .put_all(
            &prepared,
            &[now.clone(), gone.clone(), later.clone(), past.clone()],
            go(),
        )
        .await
        .unwrap();
    let lost = message(26, 0, db, "batch-phone", "sales", 0);
    let far = Timestamp::from_millis(FAR);
    let ops = [
        Op::Delete {
            name: name(&gone),
            at: prepared.clone(),
        },
        Op::Schedule {
            name: name(&later),
            from: prepared.clone(),
            until: far,
        },
        Op::Move {
            name: name(&now),
            from: prepared.clone(),
            to: inbox.clone(),
        },
        Op::Move {
            name: name(&upload),
            from: queue.clone(),
            to: log.clone(),
        },
        Op::Schedule {
            name: name(&past),
            from: prepared.clone(),
            until: Timestamp::from_millis(0),
        },
        Op::Move {
            name: name(&lost),
            from: prepared.clone(),
            to: inbox.clone(),
        },
    ];

    let first = store.apply(None, &ops).await;
    let outcomes: Vec<_> = first.results.into_iter().map(outcome).collect();
    let done = Some(Outcome::Done);
    assert_eq!(outcomes, [done, done, done, done, done, None]);
    assert_eq!(first.arrivals, BTreeSet::from([id("batch-phone")]));
    let mut delivered = store.oldest(&inbox, 10).await.unwrap();
    delivered.sort_by_key(|n| n.id);
    assert_eq!(delivered, [name(&now), name(&past)]);
    assert_eq!(store.count(&prepared).await.unwrap(), 0);
    assert_eq!(store.count(&queue).await.unwrap(), 0);
    assert_eq!(store.oldest(&log, 10).await.unwrap(), [name(&upload)]);
    let expected = scheduled_entry(later.id, later.to_file_bytes().unwrap(), far);
    let source = expected.source.clone();
    let scheduler = kept.clone();
    let aside = tokio::task::spawn_blocking(move || {
        kept.scan(Read::first(&source, 10), u64::MAX, &|_| false)
    })
    .await
    .unwrap()
    .unwrap()
    .entries;
    assert_eq!(aside, [expected]);

    let again = store.apply(None, &ops).await;
    // A move found done counts as an arrival again: a push too many is
    // harmless, one too few leaves a recipient waiting.
    assert_eq!(again.arrivals, BTreeSet::from([id("batch-phone")]));
    let again: Vec<_> = again.results.into_iter().map(outcome).collect();
    let already = Some(Outcome::AlreadyDone);
    assert_eq!(again, [already, already, already, already, already, None]);

    // A scheduled message is found done where the scheduler's delivery and
    // its recipient's acknowledgement took it (`past`, in `Log`); one gone
    // from the scheduler and never delivered (`later`, cancelled) is missing.
    let acked = store
        .apply(
            None,
            &[Op::Move {
                name: name(&past),
                from: inbox.clone(),
                to: at("batch-phone", Folder::Log),
            }],
        )
        .await;
    assert_eq!(
        acked.results.into_iter().map(outcome).collect::<Vec<_>>(),
        [done]
    );
    let cancel = estafeta_repeat::store::Op::Cancel {
        id: later.id.to_string(),
    };
    tokio::task::spawn_blocking(move || scheduler.apply(&[cancel]))
        .await
        .unwrap()
        .unwrap();
    let schedules = [ops[1].clone(), ops[4].clone()];
    let third = store.apply(None, &schedules).await;
    let third: Vec<_> = third.results.into_iter().map(outcome).collect();
    assert_eq!(third, [None, already]);

    let inbox_names = store.oldest(&inbox, 10).await.unwrap();
    let results = store.delete_all(&inbox, &inbox_names).await;
    assert!(results.into_iter().all(|r| r.unwrap() == Outcome::Done));
    let results = store.delete_all(&inbox, &inbox_names).await;
    assert!(
        results
            .into_iter()
            .all(|r| r.unwrap() == Outcome::AlreadyDone)
    );
    assert_eq!(store.count(&inbox).await.unwrap(), 0);
}

/// `delivered`: in `Messages`, `Log`, `Unknown` or `Error` of its
/// recipient, not in a `Prepared`; a message put again where it is stays
/// one message.
async fn delivered_and_put_again(store: &dyn MessageStore) {
    let prepared = at("dlv-db", Folder::Prepared);
    let reply = message(31, 0, "dlv-db", "dlv-phone", "sales", 0);
    store.put(&prepared, &reply).await.unwrap();
    assert!(!store.delivered(&name(&reply)).await.unwrap());
    let mut here = prepared;
    for folder in [
        Folder::Messages,
        Folder::Log,
        Folder::Unknown,
        Folder::Error,
        Folder::Messages,
    ] {
        let to = at("dlv-phone", folder);
        let applied = store
            .apply(
                None,
                &[Op::Move {
                    name: name(&reply),
                    from: here,
                    to: to.clone(),
                }],
            )
            .await;
        let result = applied.results.into_iter().next().unwrap();
        assert_eq!(outcome(result), Some(Outcome::Done), "{folder:?}");
        assert!(store.delivered(&name(&reply)).await.unwrap(), "{folder:?}");
        here = to;
    }
    let unknown = message(39, 0, "dlv-db", "dlv-phone", "sales", 0);
    assert!(!store.delivered(&name(&unknown)).await.unwrap());

    store.put(&here, &reply).await.unwrap();
    assert_eq!(names(&store.list(&here).await.unwrap()), [name(&reply)]);
}

/// `remove_older_than` (by the arrival time in the id, sparing `keep`) and
/// `remove_mailbox`.
async fn retention_and_removal(store: &dyn MessageStore) {
    let log = at("old-db", Folder::Log);
    let queue = at("old-db", Folder::Messages);
    // Created in the reverse order of arrival: age is arrival, not creation.
    let ms: Vec<Message> = (0..5)
        .map(|i| {
            message(
                41 + i * 1000,
                10 - i64::try_from(i).unwrap(),
                "p",
                "old-db",
                "s",
                0,
            )
        })
        .collect();
    store.put_all(&log, &ms, go()).await.unwrap();
    store
        .put(&queue, &message(50, 0, "p", "old-db", "s", 0))
        .await
        .unwrap();
    // Arrived before T0 + 3000: ms[0], ms[1], ms[2], of which ms[1] is kept.
    let cutoff = Timestamp::from_millis(i64::try_from(T0 + 3000).unwrap());
    let keep = HashSet::from([ms[1].id]);
    assert_eq!(
        store.remove_older_than(&log, cutoff, &keep).await.unwrap(),
        2
    );
    let mut left = store.list(&log).await.unwrap();
    left.sort_by_key(|e| e.name.id);
    assert_eq!(names(&left), [name(&ms[1]), name(&ms[3]), name(&ms[4])]);
    assert_eq!(
        store.remove_older_than(&log, cutoff, &keep).await.unwrap(),
        0
    );
    assert_eq!(store.count(&queue).await.unwrap(), 1);

    assert_eq!(store.remove_mailbox(&id("old-db")).await.unwrap(), 4);
    for folder in Folder::ALL {
        assert_eq!(store.count(&at("old-db", folder)).await.unwrap(), 0);
    }
    assert_eq!(store.remove_mailbox(&id("old-db")).await.unwrap(), 0);
    // Other mailboxes keep their messages.
    assert_eq!(
        store.count(&at("sel-db", Folder::Messages)).await.unwrap(),
        5
    );
    store.create_mailbox(&id("old-db")).await.unwrap();
}

/// A removed mailbox: its messages and those scheduled for it are gone;
/// a new message for it is refused, one a batch moves or schedules for
/// it is discarded; made again, it starts empty and takes messages.
async fn a_removed_mailbox_takes_nothing_until_made_again(store: &dyn MessageStore) {
    let (phone, db) = (id("gone-phone"), id("gone-db"));
    store.create_mailbox(&phone).await.unwrap();
    store.create_mailbox(&db).await.unwrap();
    let inbox = at("gone-phone", Folder::Messages);
    let prepared = at("gone-db", Folder::Prepared);
    let far = Timestamp::from_millis(4_102_444_800_000);
    store
        .put(&inbox, &message(61, 0, "gone-db", "gone-phone", "s", 0))
        .await
        .unwrap();
    store
        .schedule(&message(62, 0, "gone-db", "gone-phone", "s", 0), far)
        .await
        .unwrap();
    let replies = [63, 64].map(|seq| message(seq, 0, "gone-db", "gone-phone", "s", 0));
    store.put_all(&prepared, &replies, go()).await.unwrap();
    assert_eq!(store.scheduled_for(&phone).await.unwrap(), 1);
    assert_eq!(store.scheduled_for(&db).await.unwrap(), 0);

    assert_eq!(store.remove_mailbox(&phone).await.unwrap(), 2);
    assert_eq!(store.scheduled_for(&phone).await.unwrap(), 0);
    let refused = store
        .put(&inbox, &message(65, 0, "gone-db", "gone-phone", "s", 0))
        .await;
    assert!(
        matches!(refused, Err(MailboxError::NoMailbox(_))),
        "{refused:?}"
    );
    let refused = store
        .schedule(&message(66, 0, "gone-db", "gone-phone", "s", 0), far)
        .await;
    assert!(
        matches!(refused, Err(MailboxError::NoMailbox(_))),
        "{refused:?}"
    );
    let ops = [
        Op::Move {
            name: name(&replies[0]),
            from: prepared.clone(),
            to: inbox.clone(),
        },
        Op::Schedule {
            name: name(&replies[1]),
            from: prepared.clone(),
            until: far,
        },
    ];
    for r in store.apply(None, &ops).await.results {
        r.unwrap();
    }
    assert_eq!(store.count(&prepared).await.unwrap(), 0, "discarded");
    assert_eq!(store.count(&inbox).await.unwrap(), 0);
    assert_eq!(store.scheduled_for(&phone).await.unwrap(), 0);

    store.create_mailbox(&phone).await.unwrap();
    assert_eq!(store.count(&inbox).await.unwrap(), 0, "made again empty");
    store
        .put(&inbox, &message(67, 0, "gone-db", "gone-phone", "s", 0))
        .await
        .unwrap();
    assert_eq!(store.count(&inbox).await.unwrap(), 1);
}

fn upload(seq: i64, expires: i64) -> KeyedUpload {
    KeyedUpload {
        name: name(&message(
            u64::try_from(seq).unwrap(),
            0,
            "phone-1",
            "db-a",
            "sales",
            0,
        ))
        .to_string(),
        at: Timestamp::from_millis(seq),
        expires_at: Timestamp::from_millis(expires),
    }
}

/// Runs every check of the [`UploadKeys`] contract on `keys`, a fresh
/// store (blocking: call it off the async runtime's threads).
pub fn upload_keys_contract(keys: &dyn UploadKeys) {
    let (phone1, phone2) = (id("phone-1"), id("phone-2"));
    let t = Timestamp::from_millis;
    assert!(keys.is_empty().unwrap());
    assert_eq!(keys.get(&phone1, "k", t(0)).unwrap(), None);

    // Keys are per device; a put replaces.
    keys.put(&phone1, "k", &upload(1, 100)).unwrap();
    keys.put(&phone2, "k", &upload(2, 100)).unwrap();
    assert_eq!(keys.get(&phone1, "k", t(50)).unwrap(), Some(upload(1, 100)));
    assert_eq!(keys.get(&phone2, "k", t(50)).unwrap(), Some(upload(2, 100)));
    keys.put(&phone1, "k", &upload(3, 200)).unwrap();
    assert_eq!(
        keys.get(&phone1, "k", t(150)).unwrap(),
        Some(upload(3, 200))
    );
    assert_eq!(keys.len().unwrap(), 2);

    // Expired at its expiry, not before.
    assert_eq!(
        keys.get(&phone1, "k", t(199)).unwrap(),
        Some(upload(3, 200))
    );
    assert_eq!(keys.get(&phone1, "k", t(200)).unwrap(), None);

    // `put_all` records every entry; `remove_device` forgets a device's
    // (twice is fine), no other's.
    let batch: Vec<(Id, String, KeyedUpload)> = (1..5)
        .map(|i| (phone1.clone(), format!("b{i}"), upload(10 + i, 300 + i)))
        .collect();
    keys.put_all(&batch).unwrap();
    let phone3 = id("phone-3");
    keys.put(&phone3, "b1", &upload(20, 1_000)).unwrap();
    keys.put(&phone3, "b9", &upload(21, 1_000)).unwrap();
    assert_eq!(keys.len().unwrap(), 8);
    assert_eq!(keys.remove_device(&phone3).unwrap(), 2);
    assert_eq!(keys.remove_device(&phone3).unwrap(), 0);
    assert_eq!(keys.get(&phone3, "b1", t(0)).unwrap(), None);
    assert!(keys.get(&phone1, "b1", t(0)).unwrap().is_some());
    assert_eq!(keys.len().unwrap(), 6);

    // The sweep: soonest expired first, in bounded batches, live ones kept.
    assert_eq!(keys.expire(t(200), 100).unwrap(), 2);
    assert_eq!(keys.expire(t(303), 2).unwrap(), 2);
    assert_eq!(
        keys.get(&phone1, "b3", t(0)).unwrap(),
        Some(upload(13, 303))
    );
    assert_eq!(keys.get(&phone1, "b2", t(0)).unwrap(), None);
    assert_eq!(keys.expire(t(303), 10).unwrap(), 1);
    assert_eq!(keys.expire(t(303), 10).unwrap(), 0);
    assert_eq!(keys.len().unwrap(), 1);
    assert_eq!(keys.expire(t(1_000), 10).unwrap(), 1);
    assert!(keys.is_empty().unwrap());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::RedbKeys;

    #[tokio::test]
    async fn the_file_store_keeps_the_contract() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, scheduled) = file_store(tmp.path()).await;
        message_store_contract(&*store, scheduled).await;
    }

    #[test]
    fn redb_keys_keep_the_contract() {
        let tmp = tempfile::tempdir().unwrap();
        upload_keys_contract(&RedbKeys::open(tmp.path().join("keys.redb")).unwrap());
    }
}
