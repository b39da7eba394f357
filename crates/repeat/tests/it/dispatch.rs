//! The dispatcher loop: worker limit, order within and between sources,
//! early wake-up, sleeping while no worker is free, retries.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{BreakableStore, Breaks, Probe, Running, T0, entry, memory_scheduler};
use estafeta_repeat::{
    Clock, Delivery, MemoryStore, Options, Outcome, RetryPolicy, Scheduler, SourceOrder, TestClock,
};
use std::sync::atomic::Ordering;

#[tokio::test(start_paused = true)]
async fn ten_thousand_due_in_one_second_go_out_eight_at_a_time_in_order() {
    let (clock, s) = memory_scheduler(Options::default());
    let sources = ["a", "b", "c", "d"];
    let entries = (0..10_000)
        .map(|i| entry(sources[i % 4], T0 + 5, &format!("{i:05}")))
        .collect();
    s.schedule_all(entries).await.unwrap();

    let (probe, running) =
        Probe::start(&s, &clock, 8, Duration::from_millis(10), |_| Outcome::Done);
    probe.wait_for(10_000).await;
    running.stop().await;

    let log = probe.log();
    assert_eq!(log.len(), 10_000);
    assert_eq!(
        probe.max_running(),
        8,
        "never more than the free workers, and all of them used"
    );
    let ids: HashSet<_> = log.iter().map(|f| f.id.clone()).collect();
    assert_eq!(ids.len(), 10_000, "no entry handed out twice");
    assert!(
        log.iter().all(|f| f.at >= Duration::from_secs(T0 + 5)),
        "none before its time"
    );
    for source in sources {
        let order: Vec<_> = log
            .iter()
            .filter(|f| f.source == source)
            .map(|f| f.id.clone())
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "source {source} read in due order");
    }
    let stats = s.stats().await.unwrap();
    assert!(
        stats.sources.values().all(|s| s.entries == 0),
        "all removed: {stats:?}"
    );
    assert_eq!(stats.done, 10_000);
    assert_eq!(stats.in_flight, 0);
}

/// A dispatcher of two workers whose loop sleeps towards the one entry, an
/// hour after [`T0`], 10.4 s into that sleep (mid-second).
async fn asleep_an_hour_ahead() -> (Scheduler<MemoryStore, TestClock>, Arc<Probe>, Running) {
    let (clock, s) = memory_scheduler(Options::default());
    s.schedule("later", T0 + 3_600, "late", b"").await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);
    tokio::time::sleep(Duration::from_millis(10_400)).await;
    (s, probe, running)
}

#[tokio::test(start_paused = true)]
async fn an_entry_earlier_than_the_deadline_fires_within_a_second() {
    // The loop is asleep waiting for T0+3600; schedule mid-second for sooner.
    let (s, probe, running) = asleep_an_hour_ahead().await;
    s.schedule("soon", T0 + 20, "soon", b"").await.unwrap();
    s.schedule("now", T0 + 10, "now", b"").await.unwrap();
    probe.wait_for(2).await;
    running.stop().await;

    let log = probe.log();
    let lag = |id: &str| {
        let f = log.iter().find(|f| f.id == id).unwrap();
        f.at - Duration::from_secs(f.due)
    };
    assert!(lag("now") < Duration::from_secs(1), "{:?}", lag("now"));
    assert!(lag("soon") < Duration::from_secs(1), "{:?}", lag("soon"));
    assert_eq!(log.len(), 2, "the hour-later entry is not due");
}

/// An entry scheduled only if its id is absent wakes the sleeping loop as a
/// scheduled one does; scheduled again under the same id, it stays as it
/// is (not moved, not handed out twice).
#[tokio::test(start_paused = true)]
async fn an_entry_scheduled_if_absent_wakes_the_loop_and_is_kept_once() {
    let (s, probe, running) = asleep_an_hour_ahead().await;
    assert!(
        s.schedule_if_absent("now", T0 + 10, "now", b"a")
            .await
            .unwrap()
    );
    assert!(
        !s.schedule_if_absent("now", T0 + 5, "now", b"b")
            .await
            .unwrap()
    );
    probe.wait_for(1).await;
    running.stop().await;

    let log = probe.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!((log[0].id.as_str(), log[0].due), ("now", T0 + 10));
    let lag = log[0].at - Duration::from_secs(log[0].due);
    assert!(lag < Duration::from_secs(1), "{lag:?}");
}

/// A busy source `a` with many due entries, and a quiet source `b` with a few.
async fn busy_and_quiet(order: SourceOrder) -> Vec<String> {
    let (clock, s) = memory_scheduler(Options {
        order,
        ..Options::default()
    });
    let mut entries: Vec<_> = (0..500)
        .map(|i| entry("a", T0 - 10, &format!("a{i:03}")))
        .collect();
    entries.extend((0..5).map(|i| entry("b", T0, &format!("b{i}"))));
    s.schedule_all(entries).await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::from_millis(5), |_| Outcome::Done);
    probe.wait_for(505).await;
    running.stop().await;
    probe.log().into_iter().map(|f| f.source).collect()
}

#[tokio::test(start_paused = true)]
async fn fair_order_does_not_let_a_busy_source_starve_another() {
    let sources = busy_and_quiet(SourceOrder::Fair).await;
    let last_b = sources.iter().rposition(|s| s == "b").unwrap();
    assert!(
        last_b < 12,
        "quiet source served alongside the busy one: last at {last_b}"
    );
}

#[tokio::test(start_paused = true)]
async fn nearest_first_order_drains_the_busy_source_first() {
    let sources = busy_and_quiet(SourceOrder::NearestFirst).await;
    let first_b = sources.iter().position(|s| s == "b").unwrap();
    assert_eq!(
        first_b, 500,
        "the seed's order starves the quiet source until the busy one is empty"
    );
}

#[tokio::test(start_paused = true)]
async fn no_free_worker_for_an_hour_means_the_loop_sleeps() {
    let (clock, s) = memory_scheduler(Options::default());
    let entries = (0..50)
        .map(|i| entry("a", T0, &format!("{i:02}")))
        .collect();
    s.schedule_all(entries).await.unwrap();
    let (probe, running) =
        Probe::start(&s, &clock, 2, Duration::from_secs(3_600), |_| Outcome::Done);
    probe.wait_for(2).await;
    // Paused time only advances once every task is idle, so after this the
    // dispatcher is parked waiting for a worker.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = s.stats().await.unwrap().wakeups;
    tokio::time::sleep(Duration::from_secs(3_598)).await;
    let during = s.stats().await.unwrap();
    assert_eq!(
        during.wakeups, before,
        "no wake-up while every worker is busy"
    );
    assert_eq!(
        (during.dispatched, during.in_flight),
        (8, 8),
        "taken for the pool's 2 workers and 3 more per worker (prefetch 4), 2 started"
    );
    probe.wait_for(4).await;
    assert_eq!(
        s.stats().await.unwrap().dispatched,
        8,
        "the next 2 came from those taken, not from a new pass"
    );
    running.stop().await;
    assert_eq!(probe.max_running(), 2);
    let started: Vec<String> = probe.log().into_iter().map(|f| f.id).collect();
    assert_eq!(
        started,
        ["00", "01", "02", "03"],
        "started in the order taken"
    );
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (stats.done, stats.in_flight, stats.sources["a"].entries),
        (4, 0, 46),
        "the 4 taken and never started are left as they were"
    );
}

/// With at-most-once delivery a pass takes entries only for its free
/// workers: a taken entry is removed at once, and one waiting for a worker
/// would be lost in a crash.
#[tokio::test(start_paused = true)]
async fn at_most_once_takes_only_for_the_free_workers() {
    let (clock, s) = memory_scheduler(Options {
        delivery: Delivery::AtMostOnce,
        ..Options::default()
    });
    let entries = (0..10)
        .map(|i| entry("a", T0, &format!("{i:02}")))
        .collect();
    s.schedule_all(entries).await.unwrap();
    let (probe, running) =
        Probe::start(&s, &clock, 2, Duration::from_secs(3_600), |_| Outcome::Done);
    probe.wait_for(2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = s.stats().await.unwrap();
    assert_eq!(
        (stats.dispatched, stats.sources["a"].entries),
        (2, 8),
        "two taken and removed, eight still stored"
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_handler_is_retried_with_backoff() {
    let retry = RetryPolicy {
        first: Duration::from_secs(10),
        max: Duration::from_secs(25),
    };
    let (clock, s) = memory_scheduler(Options {
        retry,
        ..Options::default()
    });
    s.schedule("a", T0, "flaky", b"").await.unwrap();
    let probe = Probe::new(clock.clone());
    let handler = probe.handler(Duration::ZERO, |e| {
        if e.attempt < 3 {
            Outcome::Failed("not yet".into())
        } else {
            Outcome::Done
        }
    });
    let running = Running::start(&s, 1, handler);
    probe.wait_for(4).await;
    running.stop().await;
    let log = probe.log();
    let attempts: Vec<_> = log.iter().map(|f| (f.attempt, f.due - T0)).collect();
    assert_eq!(attempts, vec![(0, 0), (1, 10), (2, 30), (3, 55)]);
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.failed, stats.done), (3, 1));
    assert_eq!(stats.sources["a"].entries, 0);
}

#[tokio::test(start_paused = true)]
async fn reschedule_from_the_handler_keeps_a_periodic_entry_going() {
    let (clock, s) = memory_scheduler(Options::default());
    s.schedule("jobs", T0 + 60, "sweep", b"").await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 1, Duration::ZERO, |e| {
        Outcome::Reschedule(e.due + 60)
    });
    probe.wait_for(5).await;
    running.stop().await;
    let dues: Vec<_> = probe.log().iter().map(|f| f.due - T0).collect();
    assert_eq!(dues, vec![60, 120, 180, 240, 300]);
    let log = probe.log();
    assert!(
        log.iter()
            .all(|f| f.at - Duration::from_secs(f.due) < Duration::from_secs(1))
    );
    assert_eq!(
        s.stats().await.unwrap().sources["jobs"].entries,
        1,
        "still scheduled"
    );
}

#[tokio::test(start_paused = true)]
async fn at_most_once_removes_the_entry_before_the_handler_runs() {
    let (clock, s) = memory_scheduler(Options {
        delivery: Delivery::AtMostOnce,
        ..Options::default()
    });
    s.schedule("a", T0, "one", b"").await.unwrap();
    s.schedule("a", T0, "two", b"").await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 4, Duration::from_secs(100), |e| {
        if e.id == "two" {
            Outcome::Reschedule(e.due + 1_000)
        } else {
            Outcome::Done
        }
    });
    probe.wait_for(2).await;
    let stats = s.stats().await.unwrap();
    assert_eq!(
        stats.sources["a"].entries, 0,
        "removed while handlers still run"
    );
    assert_eq!(stats.in_flight, 2);
    tokio::time::sleep(Duration::from_secs(101)).await;
    running.stop().await;
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.sources["a"].entries, 1, "the rescheduled one is back");
    assert_eq!(clock.now_secs() - T0, 101);
}

#[tokio::test(start_paused = true)]
async fn cancel_and_reschedule_change_what_fires() {
    let (clock, s) = memory_scheduler(Options::default());
    for id in ["keep", "cancel", "move"] {
        s.schedule("a", T0 + 10, id, b"").await.unwrap();
    }
    assert!(s.cancel("cancel").await.unwrap());
    assert!(!s.cancel("cancel").await.unwrap());
    assert!(s.reschedule("move", T0 + 5).await.unwrap());
    assert!(!s.reschedule("missing", T0 + 5).await.unwrap());
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);
    probe.wait_for(2).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    running.stop().await;
    let fired: Vec<_> = probe
        .log()
        .iter()
        .map(|f| (f.id.clone(), f.due - T0))
        .collect();
    assert_eq!(fired, vec![("move".to_owned(), 5), ("keep".to_owned(), 10)]);
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_and_changes_nothing() {
    let (_, s) = memory_scheduler(Options::default());
    assert!(matches!(
        s.schedule("bad/name", T0, "x", b"").await,
        Err(estafeta_repeat::Error::InvalidSource(_))
    ));
    assert!(matches!(
        s.schedule("a", T0, "", b"").await,
        Err(estafeta_repeat::Error::InvalidId(0))
    ));
    let too_big = vec![0u8; estafeta_repeat::MAX_PAYLOAD + 1];
    assert!(matches!(
        s.schedule("a", T0, "x", &too_big).await,
        Err(estafeta_repeat::Error::PayloadTooLarge(_))
    ));
    let mixed = vec![entry("a", T0, "fine"), entry("a", T0, "")];
    assert!(s.schedule_all(mixed).await.is_err());
    assert!(s.stats().await.unwrap().sources.is_empty());
    s.close().await;
    assert!(matches!(
        s.schedule("a", T0, "x", b"").await,
        Err(estafeta_repeat::Error::Closed)
    ));
}

#[tokio::test(start_paused = true)]
async fn only_one_dispatcher_runs_at_a_time() {
    let (clock, s) = memory_scheduler(Options::default());
    let (probe, running) = Probe::start(&s, &clock, 1, Duration::ZERO, |_| Outcome::Done);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = s
        .run(
            estafeta_repeat::WorkerPool::new(1),
            probe.handler(Duration::ZERO, |_| Outcome::Done),
            async {},
        )
        .await;
    assert!(matches!(
        second,
        Err(estafeta_repeat::Error::AlreadyRunning)
    ));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn stats_report_backlog_in_flight_and_lag() {
    let (clock, s) = memory_scheduler(Options::default());
    let mut entries: Vec<_> = (0..3)
        .map(|i| entry("a", T0 - 7, &format!("late{i}")))
        .collect();
    entries.push(entry("a", T0 + 100, "later"));
    entries.push(entry("b", T0 + 100, "other"));
    s.schedule_all(entries).await.unwrap();
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.sources["a"].entries, stats.sources["a"].due), (4, 3));
    assert_eq!((stats.sources["b"].entries, stats.sources["b"].due), (1, 0));

    let (probe, running) = Probe::start(&s, &clock, 4, Duration::from_secs(2), |_| Outcome::Done);
    probe.wait_for(3).await;
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.in_flight, 3);
    assert_eq!(stats.dispatched, 3);
    assert_eq!(
        stats.sources["a"].due, 3,
        "in flight entries stay until done"
    );
    // Handed out 7 s late: the (5 s, 10 s] bucket.
    let bucket = estafeta_repeat::LAG_BOUNDS_MS
        .iter()
        .position(|&b| b == 10_000)
        .unwrap();
    assert_eq!(stats.lag.counts[bucket], 3);
    assert_eq!(stats.lag.quantile_ms(0.99), Some(10_000));
    tokio::time::sleep(Duration::from_secs(3)).await;
    running.stop().await;
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.in_flight, stats.done), (0, 3));
    assert_eq!((stats.sources["a"].entries, stats.sources["a"].due), (1, 0));
}

/// A scheduler over a memory store that counts the reads of source `a`,
/// taking up to `prefetch` entries per worker.
fn counting_reads_of_a(
    prefetch: usize,
) -> (
    BreakableStore,
    TestClock,
    Scheduler<BreakableStore, TestClock>,
) {
    let store = BreakableStore::new(Breaks::Reads("a"));
    store.broken.store(false, Ordering::SeqCst);
    let clock = TestClock::new(T0);
    let options = Options {
        prefetch,
        ..Options::default()
    };
    let s = Scheduler::new(store.clone(), clock.clone(), options);
    (store, clock, s)
}

/// The reads of source `a` that hand out 128 entries due at once to a
/// pool of 64 workers, entry `i`'s handler holding its worker
/// `hold_ms(i % 64)` milliseconds. With `prefetch` 1 a pass takes only
/// for its free workers, so the reads count how passes gather them.
async fn reads_to_hand_out_128(prefetch: usize, hold_ms: fn(u64) -> u64) -> usize {
    let (store, _, s) = counting_reads_of_a(prefetch);
    let entries = (0..128)
        .map(|i| entry("a", T0, &format!("e{i:03}")))
        .collect();
    s.schedule_all(entries).await.unwrap();

    let (handed, mut all) = tokio::sync::watch::channel(0usize);
    let handed = Arc::new(handed);
    let handler = move |e: estafeta_repeat::Entry| {
        let handed = Arc::clone(&handed);
        async move {
            let i: u64 = e.id[1..].parse().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(hold_ms(i % 64))).await;
            handed.send_modify(|n| *n += 1);
            Outcome::Done
        }
    };
    let running = Running::start(&s, 64, handler);
    all.wait_for(|n| *n == 128).await.unwrap();
    running.stop().await;
    store.reads.load(Ordering::SeqCst)
}

/// While handlers run and only a few workers are free, a pass waits a
/// moment for more to end rather than reading for the few: handlers
/// ending four at a time, a millisecond apart, are read for eight at a
/// time (the moment is two milliseconds), not four or fewer.
#[tokio::test(start_paused = true)]
async fn a_pass_with_few_free_workers_waits_a_moment_for_more() {
    // One read for the first 64, then about one per eight handlers ended
    // (11 when each pass reads for the few free at once).
    let reads = reads_to_hand_out_128(1, |i| i / 4 + 1).await;
    assert!(reads <= 9, "{reads} reads to hand out 128 entries");
}

/// A pass waits a moment for all of the running handlers' workers, not
/// only for a few: handlers ending in two halves a millisecond apart are
/// read for together, a whole pool at a time (a pass taking the half that
/// ended first reads three times).
#[tokio::test(start_paused = true)]
async fn a_pass_waits_a_moment_for_the_whole_pool() {
    let reads = reads_to_hand_out_128(1, |i| 1 + i / 32).await;
    assert_eq!(reads, 2, "reads of 64 entries");
}

/// A pass takes up to [`Options::prefetch`] entries per worker of the
/// pool, those beyond the free workers starting as workers free up: the
/// 128 entries for 64 workers are one read, not two.
#[tokio::test(start_paused = true)]
async fn a_pass_takes_entries_ahead_for_the_busy_workers() {
    let reads = reads_to_hand_out_128(Options::default().prefetch, |i| 1 + i / 32).await;
    assert_eq!(reads, 1, "one read of 128 entries");
    assert_eq!(reads_to_hand_out_128(2, |i| 1 + i / 32).await, 1);
}

/// Room that does not divide among the ready sources is still one read
/// of each: a read is a store call (a round trip, and a hold on a
/// database), so a second read for the remainder would cost as much as
/// the first. Seven workers over three sources take 3, 2 and 2.
#[tokio::test(start_paused = true)]
async fn a_pass_shares_out_its_whole_room_in_one_read() {
    let (store, clock, s) = counting_reads_of_a(1);
    let entries = ["a", "b", "c"]
        .iter()
        .flat_map(|source| (1..=3).map(move |i| entry(source, T0, &format!("{source}{i}"))))
        .collect();
    s.schedule_all(entries).await.unwrap();

    let (probe, running) =
        Probe::start(&s, &clock, 7, Duration::from_secs(3_600), |_| Outcome::Done);
    probe.wait_for(7).await;
    let ids: Vec<String> = probe.log().into_iter().map(|f| f.id).collect();
    assert_eq!(ids, ["a1", "a2", "a3", "b1", "b2", "c1", "c2"]);
    assert_eq!(store.reads.load(Ordering::SeqCst), 1, "source a read once");
    running.stop().await;
}
