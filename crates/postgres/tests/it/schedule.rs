//! The repeat scheduler's store over PostgreSQL: its ops as the embedded
//! stores do them, reads that see what other nodes wrote, the exchange's
//! scheduled delivery run by two nodes' plain schedulers at once giving one
//! message, and claiming reads of `deliver_at` handing each due message to
//! one node, to another once the lease of a claimer that died ends.

use crate::common::{blocking, entries_left, entry, until_waiting_for_lock};
use estafeta_exchange::store::{
    FileName, Folder, Listed, Location, MessageReads, MessageSteps, MessageUpkeep, Op as MessageOp,
};
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{PgMessages, PgQueue, PgSchedule, Store};
use estafeta_repeat::store::conformance::{self, ids, placed};
use estafeta_repeat::store::{Applied, Op, Read};
use estafeta_repeat::{
    Entry, Options, Outcome, Position, Scheduler, Store as _, TestClock, WorkerPool,
};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

/// The store migrated, with the mailboxes the tests write to made.
async fn store(pg: &Postgres) -> Store {
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    let owners = ["db-a", "phone-1"].map(|o| Id::new(o).unwrap());
    for made in PgMessages::new(store.clone())
        .create_mailboxes(&owners)
        .await
    {
        made.unwrap();
    }
    store
}

/// A batch of outcomes costs a statement per run of one kind of op, not a
/// statement per entry (a dispatch of 100,000 due entries is 100,000
/// removals): counted by a statement-level trigger on the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_ops_is_one_statement_per_run_of_one_kind() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    db.client()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE statements (n integer NOT NULL);
             INSERT INTO statements VALUES (0);
             CREATE FUNCTION count_statement() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN UPDATE statements SET n = n + 1; RETURN NULL; END $$;
             CREATE TRIGGER counted AFTER INSERT OR UPDATE OR DELETE ON repeat_entries
                 FOR EACH STATEMENT EXECUTE FUNCTION count_statement();",
        )
        .await
        .unwrap();
    let statements = || {
        let db = db.clone();
        async move {
            let client = db.client().await.unwrap();
            let n: i32 = client
                .query_one("SELECT n FROM statements", &[])
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    let schedule = Arc::new(PgSchedule::new(db.clone()));
    let apply = |ops: Vec<Op>| {
        let schedule = schedule.clone();
        blocking(move || schedule.apply(&ops).unwrap())
    };
    let all: Vec<Entry> = (0..200)
        .map(|i| entry("a", 10, &format!("e{i:03}")))
        .collect();

    let applied = apply(all.iter().cloned().map(Op::Put).collect()).await;
    assert_eq!(applied[199], placed("a", 10, "e199"));
    // An upsert fires the triggers of both an INSERT and an UPDATE.
    assert_eq!(statements().await, 2, "200 puts");

    let mut ops: Vec<Op> = all[..100].iter().cloned().map(Op::Remove).collect();
    ops.extend(all[100..].iter().map(|e| Op::Move {
        entry: e.clone(),
        due: 20,
        attempt: 1,
    }));
    // The same entry again: the run ends there, and the second removal
    // sees the first.
    ops.push(Op::Remove(all[0].clone()));
    let applied = apply(ops).await;
    assert!(applied[..100].iter().all(|a| *a == Applied::Removed));
    assert_eq!(applied[150], placed("a", 20, "e150"));
    assert_eq!(applied[200], Applied::Unchanged);
    assert_eq!(
        statements().await,
        2 + 3,
        "100 removals, 100 moves, 1 removal"
    );
    let scan = blocking({
        let schedule = schedule.clone();
        move || ids(schedule.as_ref(), "a", 100)
    })
    .await;
    assert_eq!(scan.len(), 100);
}

/// Every op as the redb and memory stores do it (the repeat crate's store
/// contract, `conformance::ops`), and the two ways reads differ: they
/// start at the source's first entry whatever the cursor, and a read that
/// finds nothing more due asks to be read again the next second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_and_reads_of_the_scheduler_store() {
    let pg = Postgres::start().unwrap();
    let schedule = PgSchedule::new(store(&pg).await);
    blocking(move || {
        let s = &schedule;
        conformance::ops(s, scans);
        assert_eq!(s.sources().unwrap(), ["a", "b", "c", "deliver_at"]);

        // A failed batch changes nothing.
        let bad = Op::Put(Entry {
            id: "bad\0id".into(),
            ..entry("c", 1, "t")
        });
        assert!(s.apply(&[Op::Put(entry("c", 2, "u")), bad]).is_err());
        assert_eq!(ids(s, "c", 100), Vec::<String>::new());
    })
    .await;
}

/// Runs of exact removals, as the dispatcher writes finished deliveries,
/// answer as each would alone (`conformance::removal_runs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_removals_answer_as_each_alone() {
    let pg = Postgres::start().unwrap();
    let schedule = PgSchedule::new(store(&pg).await);
    blocking(move || conformance::removal_runs(&schedule)).await;
}

/// The store's scans, on the store as [`conformance::ops`] hands it over:
/// limits and skips as the embedded stores', but a read starts at the
/// source's first entry whatever its `from`, and the next due second it
/// gives is when to look again: the second after `now` when the source
/// has nothing more due.
fn scans(s: &PgSchedule) {
    let scan = s.scan(Read::first("a", 1), 100, &|p| p.id == "w").unwrap();
    assert_eq!(scan.entries, [entry("a", 10, "y")]);
    // Nothing more in the source: look again at the next second.
    assert_eq!(scan.next_due, Some(101));
    let past_all = Position {
        due: 1_000,
        id: "z".into(),
    };
    let scan = s
        .scan(
            Read {
                source: "a",
                from: Bound::Excluded(&past_all),
                limit: 10,
            },
            100,
            &|_| false,
        )
        .unwrap();
    assert_eq!(scan.entries.len(), 2);
    // The next entry is due at 30, after 20: look again at 21 already.
    let scan = s.scan(Read::first("b", 10), 20, &|_| false).unwrap();
    assert_eq!((scan.entries.len(), scan.next_due), (1, Some(21)));
}

struct Fixed(u64);

impl estafeta_session::Clock for Fixed {
    fn now(&self) -> estafeta_session::Timestamp {
        estafeta_session::Timestamp(self.0)
    }
}

/// Two nodes, each with its own pool and its own scheduler on the shared
/// table, both running before the message is scheduled by a third party's
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
            let handler = move |entry: Entry| {
                let (messages, both_read, handed) =
                    (messages.clone(), both_read.clone(), handed.clone());
                async move {
                    let _ = handed.send(entry.id.clone());
                    both_read.wait().await;
                    deliver(messages, entry).await
                }
            };
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            scheduler.run(WorkerPool::new(2), handler, shutdown).await
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
        .apply(
            None,
            &[MessageOp::Schedule {
                name: FileName::of(&reply),
                from: prepared,
                until: Timestamp::from_millis(1_000),
            }],
        )
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

/// A claiming queue reads the shares of all the sources a dispatch pass
/// serves at once: each source up to its limit, with where to read it
/// again; a source not the queue's reads as empty; what it took is not
/// due again until the lease ends, and the next read takes what was left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claiming_read_of_several_sources_takes_each_share() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    let queue = PgQueue::claiming(db.clone(), &["a", "b"], Duration::from_secs(30));
    blocking(move || {
        let put = |src: &str, due, id: &str| Op::Put(entry(src, due, id));
        queue
            .apply(&[
                put("a", 10, "a1"),
                put("a", 11, "a2"),
                put("a", 12, "a3"),
                put("b", 10, "b1"),
                put("b", 500, "b2"),
                put("c", 10, "c1"),
            ])
            .unwrap();
        let reads = |limits: [usize; 3]| -> Vec<(Vec<String>, Option<u64>)> {
            let reads: Vec<Read<'_>> = ["a", "c", "b"]
                .into_iter()
                .zip(limits)
                .map(|(source, limit)| Read {
                    source,
                    from: Bound::Unbounded,
                    limit,
                })
                .collect();
            queue
                .scan_sources(&reads, 100, &|_, at| at.id == "never")
                .into_iter()
                .map(|scan| {
                    let scan = scan.unwrap();
                    let ids = scan.entries.iter().map(|e| e.id.clone()).collect();
                    (ids, scan.next_due)
                })
                .collect()
        };
        let first = reads([2, 5, 5]);
        assert_eq!(first[0], (vec!["a1".into(), "a2".into()], Some(12)), "a");
        assert_eq!(first[1], (vec![], None), "c is not the queue's");
        assert_eq!(
            first[2],
            (vec!["b1".into()], Some(101)),
            "b: look again next second"
        );
        let second = reads([5, 5, 5]);
        assert_eq!(second[0].0, ["a3"]);
        assert!(second[2].0.is_empty(), "b1 is claimed, b2 not due");
    })
    .await;
}

/// The lease of the claiming tests below.
const LEASE: Duration = Duration::from_secs(60);
/// How long a holding read waits for a hold to end before it leases.
const WAIT: Duration = Duration::from_millis(100);

/// Reply `n` from `db-a` to `phone-1`.
fn reply(n: u128) -> Message {
    Message {
        version: Version,
        id: MessageId::from_parts(1_764_064_800_000, n),
        from: Id::new("db-a").unwrap(),
        to: Id::new("phone-1").unwrap(),
        subsystem: Id::new("sales").unwrap(),
        created_at: Timestamp::from_millis(1_764_064_800_000),
        body: Body::from_json(r#"{"n":1}"#).unwrap(),
    }
}

/// Schedules `replies`, as a step's batch does on a clock that reads 0,
/// until a time long past by the schedulers' clocks: due at once.
async fn schedule_replies(db: &Store, replies: &[Message]) {
    let messages = PgMessages::with_clock(db.clone(), Arc::new(Fixed(0)));
    let mut ops = Vec::new();
    for reply in replies {
        let prepared = Location::new(reply.from.clone(), Folder::Prepared);
        messages.put(&prepared, reply).await.unwrap();
        ops.push(MessageOp::Schedule {
            name: FileName::of(reply),
            from: prepared,
            until: Timestamp::from_millis(1_000),
        });
    }
    let applied = messages.apply(None, &ops).await;
    assert!(applied.results.iter().all(Result::is_ok), "{applied:?}");
}

/// The exchange's delivery of a due message: into its recipient's
/// `Messages` unless it is there already.
async fn deliver(messages: PgMessages, entry: Entry) -> Outcome {
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

/// Two nodes' claiming reads of the `deliver_at` source at the same moment
/// take disjoint entries, together every due message; what they took is
/// not due for anyone until the lease ends. Listing the source (the
/// dashboard's page) through a plain queue shows every entry and takes
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_reads_of_deliver_at_at_once_take_disjoint_messages() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    let replies: Vec<Message> = (0..40).map(reply).collect();
    schedule_replies(&db, &replies).await;

    let listing = Arc::new(PgQueue::new(db.clone(), &["deliver_at"]));
    let listed = {
        let listing = listing.clone();
        blocking(move || Listed(listing).entries("deliver_at", 100).unwrap()).await
    };
    assert_eq!(listed.len(), 40);

    let now = 1_000_000;
    let at_once = Arc::new(std::sync::Barrier::new(2));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let queue = PgQueue::claiming(db.clone(), &["deliver_at"], LEASE);
            let at_once = at_once.clone();
            tokio::task::spawn_blocking(move || {
                let mut got = Vec::new();
                for _ in 0..10 {
                    at_once.wait();
                    let scan = queue
                        .scan(Read::first("deliver_at", 3), now, &|_| false)
                        .unwrap();
                    got.extend(scan.entries);
                }
                got
            })
        })
        .collect();
    let mut got = Vec::new();
    for reader in readers {
        got.push(reader.await.unwrap());
    }
    assert!(!got[0].is_empty() && !got[1].is_empty(), "both read");
    let mut taken: Vec<String> = got.iter().flatten().map(|e| e.id.clone()).collect();
    taken.sort();
    let mut all: Vec<String> = replies.iter().map(|r| r.id.to_string()).collect();
    all.sort();
    assert_eq!(taken, all, "every due message once, none twice");
    let until = now + LEASE.as_secs();
    assert!(got.iter().flatten().all(|e| e.due == until));

    let queue = Arc::new(PgQueue::claiming(db.clone(), &["deliver_at"], LEASE));
    let late = {
        let queue = queue.clone();
        blocking(move || {
            queue
                .scan(Read::first("deliver_at", 100), until - 1, &|_| false)
                .unwrap()
        })
        .await
    };
    assert!(late.entries.is_empty(), "nothing due before the lease ends");
    let listed = blocking(move || Listed(listing).entries("deliver_at", 100).unwrap()).await;
    assert_eq!(listed.len(), 40);
    assert!(
        listed.iter().all(|e| e.due == until),
        "listing took nothing"
    );
}

/// A node's scheduler takes a due message and dies with it in hand (its
/// run dropped, the entry neither removed nor moved). Until the lease
/// ends no node may take it; once the clock passes the lease another
/// node's scheduler takes it and delivers it, once, and removes its entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_claimer_died_is_delivered_by_another_node_after_the_lease() {
    let pg = Postgres::start().unwrap();
    let (a, b) = (store(&pg).await, store(&pg).await);
    let message = reply(7);
    schedule_replies(&b, std::slice::from_ref(&message)).await;
    let id = message.id.to_string();
    let clock = TestClock::new(1_000_000);
    let (handed, mut handouts) = tokio::sync::mpsc::unbounded_channel();

    let dying = {
        let scheduler = Scheduler::new(
            PgQueue::claiming(a.clone(), &["deliver_at"], LEASE),
            clock.clone(),
            Options::default(),
        );
        let handed = handed.clone();
        tokio::spawn(async move {
            let hold = move |entry: Entry| {
                let handed = handed.clone();
                async move {
                    let _ = handed.send(("a", entry.id));
                    std::future::pending::<Outcome>().await
                }
            };
            scheduler
                .run(WorkerPool::new(2), hold, std::future::pending())
                .await
        })
    };
    assert_eq!(handouts.recv().await, Some(("a", id.clone())));
    dying.abort();
    assert!(dying.await.unwrap_err().is_cancelled());
    let client = b.client().await.unwrap();
    let claimed: i64 = client
        .query_one("SELECT due FROM repeat_entries WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    let until = u64::try_from(claimed).unwrap();
    assert!(
        until >= 1_000_000 + LEASE.as_secs(),
        "claimed for the lease"
    );
    let probe = Arc::new(PgQueue::claiming(b.clone(), &["deliver_at"], LEASE));
    let early = blocking(move || {
        probe
            .scan(Read::first("deliver_at", 10), until - 1, &|_| false)
            .unwrap()
    })
    .await;
    assert!(early.entries.is_empty(), "held until the lease ends");

    let scheduler = Scheduler::new(
        PgQueue::claiming(b.clone(), &["deliver_at"], LEASE),
        clock.clone(),
        Options::default(),
    );
    let messages = PgMessages::new(b.clone());
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let live = tokio::spawn(async move {
        let take = move |entry: Entry| {
            let (messages, handed) = (messages.clone(), handed.clone());
            async move {
                let _ = handed.send(("b", entry.id.clone()));
                deliver(messages, entry).await
            }
        };
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        scheduler.run(WorkerPool::new(2), take, shutdown).await
    });
    clock.step_secs(i64::try_from(LEASE.as_secs()).unwrap() + 1);
    assert_eq!(handouts.recv().await, Some(("b", id.clone())));
    while entries_left(&b).await > 0 {
        tokio::task::yield_now().await;
    }
    stop.send(true).unwrap();
    live.await.unwrap().unwrap();
    let inbox = Location::new(message.to.clone(), Folder::Messages);
    assert_eq!(PgMessages::new(b).list(&inbox).await.unwrap().len(), 1);
    assert!(handouts.try_recv().is_err(), "handed out twice in all");
}

/// A recipient removed while a node holding its due message delivers it:
/// the removal waits on the held entry, the delivery's insert on the
/// removal, and the hold on the delivery; PostgreSQL cannot see that
/// cycle (one edge of it is the node). The store's hold limit ends the
/// hold: the removal completes, the delivery finds no mailbox, the late
/// outcome fails, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_removed_during_a_held_delivery_goes_within_the_hold_limit() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    let message = reply(9);
    schedule_replies(&db, std::slice::from_ref(&message)).await;
    let node = Store::connect_with(
        &pg.url(),
        &estafeta_postgres::Options {
            hold_limit: Duration::from_secs(1),
            ..estafeta_postgres::Options::default()
        },
    )
    .unwrap();
    let queue = Arc::new(PgQueue::holding(node, &["deliver_at"], LEASE, 1, WAIT));
    let (entries, held) = blocking(move || {
        let mut holding =
            queue.hold_sources(&[Read::first("deliver_at", 10)], 1_000_000, &|_, _| false);
        (holding.scans.pop().unwrap().unwrap().entries, holding.held)
    })
    .await;
    assert_eq!(entries.len(), 1);
    let held = held.expect("a hold");

    let removal = {
        let messages = PgMessages::new(db.clone());
        tokio::spawn(async move { messages.remove_mailbox(&Id::new("phone-1").unwrap()).await })
    };
    until_waiting_for_lock(&db, 1).await;
    let client = db.client().await.unwrap();

    let outcome = deliver(PgMessages::new(db.clone()), entries[0].clone()).await;
    assert!(
        matches!(&outcome, Outcome::Failed(e) if e.contains("phone-1")),
        "no mailbox to deliver to: {outcome:?}"
    );
    assert!(
        removal.await.unwrap().unwrap() >= 1,
        "the removal completed"
    );
    let ops = vec![Op::Remove(entries[0].clone())];
    assert!(blocking(move || held.settle(&ops)).await.is_err());
    assert_eq!(entries_left(&db).await, 0, "removed with its recipient");
    let delivered: i64 = client
        .query_one("SELECT count(*) FROM messages WHERE owner = 'phone-1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(delivered, 0);
}
