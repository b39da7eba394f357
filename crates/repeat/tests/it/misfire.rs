//! An hour of downtime: overdue entries follow the misfire policy and never
//! exceed the free workers.

use std::time::Duration;

use crate::common::{Probe, Running, T0, entry};
use estafeta_repeat::{MemoryStore, Misfire, Options, Outcome, Scheduler, TestClock};

/// 100 one-shot entries due every 36 s over an hour from T0, and a per-minute
/// periodic entry due at T0, written by a scheduler that then "went down".
async fn an_hour_of_backlog(store: &MemoryStore) {
    let before = Scheduler::new(store.clone(), TestClock::new(T0 - 1), Options::default());
    let mut entries: Vec<_> = (0..100)
        .map(|i| entry("mail", T0 + i * 36, &format!("m{i:03}")))
        .collect();
    entries.push(entry("jobs", T0, "minutely"));
    before.schedule_all(entries).await.unwrap();
    before.close().await;
}

/// Restarts an hour after T0 with `misfire`, 4 workers, runs 10 minutes of
/// virtual time (and half a minute, clear of a firing), and returns what fired.
async fn restart_after_an_hour(
    misfire: Misfire,
) -> (std::sync::Arc<Probe>, Scheduler<MemoryStore, TestClock>) {
    let store = MemoryStore::new();
    an_hour_of_backlog(&store).await;
    let clock = TestClock::new(T0 + 3_600);
    let s = Scheduler::new(
        store,
        clock.clone(),
        Options {
            misfire,
            ..Options::default()
        },
    );
    let probe = Probe::new(clock.clone());
    let handler = probe.handler(Duration::from_millis(200), |e| {
        if e.id == "minutely" {
            Outcome::Reschedule(e.due + 60)
        } else {
            Outcome::Done
        }
    });
    let running = Running::start(&s, 4, handler);
    tokio::time::sleep(Duration::from_secs(630)).await;
    running.stop().await;
    assert!(
        probe.max_running() <= 4,
        "at most the free workers: {}",
        probe.max_running()
    );
    (probe, s)
}

#[tokio::test(start_paused = true)]
async fn fire_now_catches_up_every_missed_firing() {
    let (probe, s) = restart_after_an_hour(Misfire::FireNow).await;
    let per_id = probe.per_id();
    assert_eq!(
        (0..100)
            .filter(|i| per_id.get(&format!("m{i:03}")) == Some(&1))
            .count(),
        100
    );
    // 61 missed minutes (T0..=T0+3600) caught up, then 10 more minutes on time.
    assert_eq!(per_id["minutely"], 61 + 10);
    assert_eq!(probe.max_running(), 4, "the backlog used every worker");
    assert_eq!(s.stats().await.unwrap().skipped, 0);
}

#[tokio::test(start_paused = true)]
async fn coalesce_fires_a_periodic_entry_once_for_the_missed_hour() {
    let (probe, _s) = restart_after_an_hour(Misfire::Coalesce).await;
    let log = probe.log();
    let minutely: Vec<_> = log
        .iter()
        .filter(|f| f.id == "minutely")
        .map(|f| f.due)
        .collect();
    // Once for the whole missed hour, then on time from the next minute on.
    let expected: Vec<u64> = std::iter::once(T0)
        .chain((1..=10).map(|k| T0 + 3_600 + k * 60))
        .collect();
    assert_eq!(minutely, expected);
    assert_eq!(probe.per_id().len(), 101, "every one-shot entry fired once");
}

#[tokio::test(start_paused = true)]
async fn skip_drops_entries_later_than_the_threshold() {
    let threshold = Duration::from_secs(600);
    let (probe, s) = restart_after_an_hour(Misfire::Skip { threshold }).await;
    let per_id = probe.per_id();
    // Due at T0 + 36 i; late by 3600 − 36 i at restart: kept when ≤ 600 s late.
    for i in 0..100u64 {
        let fired = per_id.contains_key(&format!("m{i:03}"));
        assert_eq!(fired, 3_600 - 36 * i <= 600, "entry {i}");
    }
    assert!(!per_id.contains_key("minutely"));
    let stats = s.stats().await.unwrap();
    let skipped = (0..100u64).filter(|i| 3_600 - 36 * i > 600).count() as u64 + 1;
    assert_eq!(stats.skipped, skipped);
    assert_eq!(stats.sources["mail"].entries, 0);
    assert_eq!(
        stats.sources["jobs"].entries, 0,
        "the late periodic entry was skipped too"
    );
}
