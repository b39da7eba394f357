//! The dispatch benchmark's scenario, shared by the bench of every store
//! (feature `test-support`): 1,000,000 entries over 16 sources, 100,000 of
//! them due in one second (the rest: [`later`]), a no-op handler on 256
//! workers; and the rounds that time a scheduler against a baseline, the
//! two sides taking turns so that both meet the same machine.
//!
//! ```no_run
//! use estafeta_repeat::bench::{self, Round};
//! # fn ours() -> Round { unimplemented!() }
//! # fn theirs() -> Round { unimplemented!() }
//! bench::alternate(5, ["scheduler", "baseline"], |side| match side {
//!     0 => ours(),
//!     _ => theirs(),
//! });
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::{Clock, Entry, Outcome, Scheduler, Store, SystemClock, WorkerPool};

/// Entries scheduled for later that stay in the store through every round,
/// beside the round's [`DUE`] ones: 900,000 (a million in all), or
/// `DISPATCH_LATER`, to see whether dispatch slows as the store grows.
///
/// # Panics
///
/// When `DISPATCH_LATER` is not a number (a bench's setting).
pub fn later() -> usize {
    std::env::var("DISPATCH_LATER")
        .ok()
        .map_or(900_000, |n| n.parse().expect("DISPATCH_LATER=N"))
}

/// Sources the entries are spread over, round-robin.
pub const SOURCES: usize = 16;
/// Entries that come due in a round's one second.
pub const DUE: usize = 100_000;
/// Workers (the scheduler's pool, the baseline's consumers).
pub const WORKERS: usize = 256;

/// What one round of one side measured: the time from the due second until
/// the last entry was handled and its outcome stored, and each entry's lag
/// (hand-out time minus the due second).
pub type Round = (Duration, Vec<Duration>);

/// The name of the `i`th entry's source.
pub fn source(i: usize) -> String {
    format!("s{:02}", i % SOURCES)
}

/// Wall-clock time since the start of second `due` (zero before it).
pub fn lag_since(due: u64) -> Duration {
    SystemClock.now().saturating_sub(Duration::from_secs(due))
}

/// The load average over the last minute, as the kernel prints it.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Runs `scheduler` with a no-op handler on [`WORKERS`] workers until the
/// [`DUE`] entries due at `due` were handled and their removals written;
/// must be called within a Tokio runtime.
///
/// # Panics
///
/// When the scheduler fails or hands out the wrong count (a bench's check).
pub async fn dispatch_round<S: Store, C: Clock>(scheduler: &Scheduler<S, C>, due: u64) -> Round {
    let lags = Arc::new(Mutex::new(Vec::with_capacity(DUE)));
    let handled = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(Notify::new());
    let handler = {
        let (lags, handled, all) = (lags.clone(), handled.clone(), all.clone());
        move |_: Entry| {
            lags.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lag_since(due));
            if handled.fetch_add(1, Ordering::SeqCst) + 1 == DUE {
                all.notify_one();
            }
            std::future::ready(Outcome::Done)
        }
    };
    let stop = async move { all.notified().await };
    // On a task of its own, as the server runs its dispatcher and as the
    // baselines run their loops: the handlers it starts go to its worker
    // thread's own queue, not through the runtime's shared one.
    let scheduler = scheduler.clone();
    tokio::spawn(async move { scheduler.run(WorkerPool::new(WORKERS), handler, stop).await })
        .await
        .expect("the dispatcher's task ends")
        .expect("the scheduler runs the round");
    let elapsed = lag_since(due);
    assert_eq!(
        handled.load(Ordering::SeqCst),
        DUE,
        "each entry handled once"
    );
    let lags = std::mem::take(&mut *lags.lock().unwrap_or_else(|p| p.into_inner()));
    (elapsed, lags)
}

/// What one side measured over its rounds.
#[derive(Default)]
struct Rounds {
    elapsed: Vec<Duration>,
    lags: Vec<Duration>,
}

impl Rounds {
    /// Entries per second over all rounds, and the lag's p50 and p99.
    fn summary(&self) -> (f64, Duration, Duration) {
        let total: Duration = self.elapsed.iter().sum();
        let rate = (DUE * self.elapsed.len()) as f64 / total.as_secs_f64();
        let mut lags = self.lags.clone();
        lags.sort();
        let q = |f: f64| {
            lags.get(((lags.len() as f64 * f) as usize).min(lags.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        (rate, q(0.5), q(0.99))
    }
}

/// Runs `rounds` rounds of each side (`round(0)` the scheduler, `round(1)`
/// the baseline), the side going first alternating from round to round;
/// prints each round's times, ratio and load average, then each side's
/// rate and lags and the median ratio (baseline time ÷ scheduler time,
/// i.e. the scheduler's entries/s ÷ the baseline's). Returns the median.
///
/// # Panics
///
/// When `rounds` is zero.
pub fn alternate(rounds: usize, names: [&str; 2], mut round: impl FnMut(usize) -> Round) -> f64 {
    assert!(rounds > 0, "at least one round");
    let mut sides = [Rounds::default(), Rounds::default()];
    let mut ratios = Vec::with_capacity(rounds);
    for n in 0..rounds {
        let load_before = load();
        let mut took = [Duration::ZERO; 2];
        for k in 0..2 {
            let side = (n + k) % 2;
            let (elapsed, lags) = round(side);
            took[side] = elapsed;
            sides[side].elapsed.push(elapsed);
            sides[side].lags.extend(lags);
        }
        let ratio = took[1].as_secs_f64() / took[0].as_secs_f64();
        ratios.push(ratio);
        println!(
            "round {}: {} {:.3} s, {} {:.3} s per 100k (ratio {ratio:.2}); load average {load_before} → {}",
            n + 1,
            names[0],
            took[0].as_secs_f64(),
            names[1],
            took[1].as_secs_f64(),
            load()
        );
    }
    for (name, side) in names.iter().zip(&sides) {
        let (rate, p50, p99) = side.summary();
        println!("{name}: {rate:.0} entries/s; lag p50 {p50:?} p99 {p99:?}");
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[rounds / 2];
    println!(
        "ratio ({} ÷ {}, entries/s): median {median:.2}, range {:.2}-{:.2} over {rounds} rounds",
        names[0],
        names[1],
        ratios[0],
        ratios[rounds - 1]
    );
    median
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sides_take_turns_going_first_and_the_median_ratio_is_returned() {
        let mut calls = Vec::new();
        let mut baseline = [3.0, 2.0, 8.0].into_iter();
        let median = alternate(3, ["ours", "theirs"], |side| {
            calls.push(side);
            let secs = match side {
                0 => 1.0,
                _ => baseline.next().unwrap(),
            };
            (Duration::from_secs_f64(secs), vec![Duration::ZERO])
        });
        assert_eq!(calls, [0, 1, 1, 0, 0, 1]);
        assert_eq!(median, 3.0);
    }

    #[test]
    fn rates_and_lags_are_over_every_round() {
        let rounds = Rounds {
            elapsed: vec![Duration::from_secs(1), Duration::from_secs(3)],
            lags: (1..=100).map(Duration::from_millis).collect(),
        };
        let (rate, p50, p99) = rounds.summary();
        assert_eq!(rate, (2 * DUE) as f64 / 4.0);
        assert_eq!(p50, Duration::from_millis(51));
        assert_eq!(p99, Duration::from_millis(100));
    }
}
