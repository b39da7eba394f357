//! The repeat scheduler's store over PostgreSQL: its ops as the embedded
//! stores do them, reads that see what other nodes wrote, and the exchange's
//! deferred delivery run by two nodes' schedulers at once giving one
//! message.

use estafeta_cluster::testing::Postgres;
use estafeta_cluster::{PgMessages, PgSchedule, Store};
use estafeta_exchange::store::{FileName, Folder, Location, MessageStore, Op as MessageOp};
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};
use estafeta_repeat::store::{Applied, Op, SourceCount};
use estafeta_repeat::{Entry, Options, Outcome, Position, Scheduler, Store as _, WorkerPool};
use std::ops::Bound;
use std::sync::Arc;

async fn store(pg: &Postgres) -> Store {
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    store
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

fn entry(source: &str, due: u64, id: &str) -> Entry {
    Entry {
        source: source.to_owned(),
        due,
        id: id.to_owned(),
        payload: id.as_bytes().to_vec(),
        attempt: 0,
    }
}

fn placed(source: &str, due: u64, id: &str) -> Applied {
    Applied::Placed {
        source: source.to_owned(),
        at: Position {
            due,
            id: id.to_owned(),
        },
    }
}

fn ids(store: &PgSchedule, source: &str, now: u64) -> Vec<String> {
    let scan = store
        .scan(source, Bound::Unbounded, now, usize::MAX, &|_| false)
        .unwrap();
    scan.entries.into_iter().map(|e| e.id).collect()
}

/// Every op as the redb and memory stores do it (the same cases as the
/// repeat crate's store contract), and the two ways reads differ: they
/// start at the source's first entry whatever the cursor, and a read that
/// finds nothing more due asks to be read again the next second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_and_reads_of_the_scheduler_store() {
    let pg = Postgres::start().unwrap();
    let schedule = PgSchedule::new(store(&pg).await);
    blocking(move || {
        let s = &schedule;
        let put = |src: &str, due, id: &str| Op::Put(entry(src, due, id));
        let applied = s
            .apply(&[
                put("a", 20, "x"),
                put("a", 10, "y"),
                put("b", 10, "z"),
                put("a", 10, "w"),
            ])
            .unwrap();
        assert_eq!(applied[1], placed("a", 10, "y"));
        let sources = s.sources().unwrap();
        assert_eq!(sources, ["a", "b", "deliver_at"]);
        assert_eq!(ids(s, "a", 100), ["w", "y", "x"], "due order, then id");

        // Putting an existing id moves it, even across sources.
        s.apply(&[put("b", 30, "x")]).unwrap();
        assert_eq!(ids(s, "a", 100), ["w", "y"]);
        assert_eq!(ids(s, "b", 100), ["z", "x"]);
        assert_eq!(
            s.count("b", 15).unwrap(),
            SourceCount { entries: 2, due: 1 }
        );
        assert_eq!(s.count("nope", 15).unwrap(), SourceCount::default());

        // Limits and skips as the other stores; the cursor is not used.
        let scan = s
            .scan("a", Bound::Unbounded, 100, 1, &|p| p.id == "w")
            .unwrap();
        assert_eq!(scan.entries, [entry("a", 10, "y")]);
        // Nothing more in the source: look again at the next second.
        assert_eq!(scan.next_due, Some(101));
        let past_all = Position {
            due: 1_000,
            id: "z".into(),
        };
        let scan = s
            .scan("a", Bound::Excluded(&past_all), 100, 10, &|_| false)
            .unwrap();
        assert_eq!(scan.entries.len(), 2);
        // The next entry is due at 30, after 20: look again at 21 already.
        let scan = s.scan("b", Bound::Unbounded, 20, 10, &|_| false).unwrap();
        assert_eq!((scan.entries.len(), scan.next_due), (1, Some(21)));

        // Exact removes and moves do nothing when the entry moved meanwhile.
        let results = s
            .apply(&[
                Op::Remove(entry("a", 20, "x")),
                Op::Move {
                    entry: entry("a", 10, "y"),
                    due: 50,
                    attempt: 3,
                },
                Op::Remove(entry("a", 10, "w")),
                Op::Cancel { id: "z".into() },
                Op::Cancel { id: "z".into() },
                Op::Reschedule {
                    id: "x".into(),
                    due: 5,
                },
                Op::Reschedule {
                    id: "nope".into(),
                    due: 5,
                },
            ])
            .unwrap();
        assert_eq!(
            results,
            [
                Applied::Unchanged,
                placed("a", 50, "y"),
                Applied::Removed,
                Applied::Removed,
                Applied::Unchanged,
                placed("b", 5, "x"),
                Applied::Unchanged,
            ]
        );
        let scan = s.scan("a", Bound::Unbounded, 100, 10, &|_| false).unwrap();
        assert_eq!(scan.entries.len(), 1);
        assert_eq!((scan.entries[0].due, scan.entries[0].attempt), (50, 3));

        // Nor when it was replaced at the same place; a restore puts an
        // entry back only if its id is free.
        let old = entry("c", 7, "r");
        let new = Entry {
            payload: b"new".to_vec(),
            ..old.clone()
        };
        s.apply(&[Op::Put(new.clone())]).unwrap();
        let results = s
            .apply(&[
                Op::Remove(old.clone()),
                Op::Move {
                    entry: old.clone(),
                    due: 9,
                    attempt: 1,
                },
                Op::Remove(Entry {
                    attempt: 1,
                    ..new.clone()
                }),
                Op::Restore(Entry { due: 1, ..old }),
                Op::Restore(entry("c", 8, "s")),
            ])
            .unwrap();
        assert_eq!(
            results,
            [
                Applied::Unchanged,
                Applied::Unchanged,
                Applied::Unchanged,
                Applied::Unchanged,
                placed("c", 8, "s"),
            ]
        );
        let scan = s.scan("c", Bound::Unbounded, 100, 10, &|_| false).unwrap();
        assert_eq!(scan.entries, [new.clone(), entry("c", 8, "s")]);

        // A failed batch changes nothing.
        let bad = Op::Put(Entry {
            id: "bad\0id".into(),
            ..entry("c", 1, "t")
        });
        assert!(s.apply(&[Op::Remove(new.clone()), bad]).is_err());
        assert_eq!(ids(s, "c", 100), ["r", "s"]);
    })
    .await;
}

struct Fixed(u64);

impl estafeta_session::Clock for Fixed {
    fn now(&self) -> estafeta_session::Timestamp {
        estafeta_session::Timestamp(self.0)
    }
}

/// Two nodes, each with its own pool and its own scheduler on the shared
/// table, both running before the message is kept aside by a third party's
/// batch: both read the due entry (neither wrote it), both run the
/// exchange's delivery (look whether it was delivered, else put it in its
/// recipient's `Messages`) at the same moment, and the recipient gets one
/// message; the entry is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_dispatching_one_due_message_deliver_it_once() {
    let pg = Postgres::start().unwrap();
    let nodes = [store(&pg).await, store(&pg).await];
    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut running = Vec::new();
    let (handed, mut handouts) = tokio::sync::mpsc::unbounded_channel();
    for node in &nodes {
        let scheduler = Scheduler::new(
            PgSchedule::new(node.clone()),
            estafeta_repeat::SystemClock,
            Options::default(),
        );
        let messages = PgMessages::new(node.clone());
        let (both_read, handed, mut stopped) = (both_read.clone(), handed.clone(), stopped.clone());
        running.push(tokio::spawn(async move {
            let deliver = move |entry: Entry| {
                let (messages, both_read, handed) =
                    (messages.clone(), both_read.clone(), handed.clone());
                async move {
                    let _ = handed.send(entry.id.clone());
                    both_read.wait().await;
                    let message: Message = serde_json::from_slice(&entry.payload).unwrap();
                    if messages.delivered(&FileName::of(&message)).await.unwrap() {
                        return Outcome::Done;
                    }
                    let inbox = Location::new(message.to.clone(), Folder::Messages);
                    match messages.put(&inbox, &message).await {
                        Ok(_) => Outcome::Done,
                        Err(e) => Outcome::Failed(e.to_string()),
                    }
                }
            };
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            scheduler.run(WorkerPool::new(2), deliver, shutdown).await
        }));
    }

    // A batch on a third pool keeps the reply aside until a time that,
    // by the schedulers' clock, has passed: due at once.
    let third = PgMessages::with_clock(store(&pg).await, Arc::new(Fixed(0)));
    let reply = Message {
        version: Version,
        id: MessageId::from_parts(1_764_064_800_000, 7),
        from: Id::new("db-a").unwrap(),
        to: Id::new("phone-1").unwrap(),
        subsystem: Id::new("sales").unwrap(),
        created_at: Timestamp::from_millis(1_764_064_800_000),
        body: Body::from_json(r#"{"n":1}"#).unwrap(),
    };
    let prepared = Location::new(reply.from.clone(), Folder::Prepared);
    third.put(&prepared, &reply).await.unwrap();
    let applied = third
        .apply(&[MessageOp::Schedule {
            name: FileName::of(&reply),
            from: prepared,
            until: Timestamp::from_millis(1_000),
        }])
        .await;
    assert!(applied.results[0].is_ok(), "{applied:?}");

    let id = reply.id.to_string();
    assert_eq!(handouts.recv().await.as_ref(), Some(&id));
    assert_eq!(handouts.recv().await.as_ref(), Some(&id));
    let inbox = Location::new(reply.to.clone(), Folder::Messages);
    let client = nodes[0].client().await.unwrap();
    loop {
        let left: i64 = client
            .query_one("SELECT count(*) FROM repeat_entries", &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    stop.send(true).unwrap();
    for r in running {
        r.await.unwrap().unwrap();
    }
    assert_eq!(third.list(&inbox).await.unwrap().len(), 1);
    assert!(handouts.try_recv().is_err(), "handed out twice in all");
}
