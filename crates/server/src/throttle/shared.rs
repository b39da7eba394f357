//! The throttle's counts held across the nodes of a cluster: every
//! [`EXCHANGE_EVERY`] a node reports what it counted since its last report
//! (wrong tokens and admin tokens, per address with an entry of its own)
//! and learns the counts every node changed since its last look
//! ([`estafeta_postgres::PgAuthFailures`]). A request never waits for the
//! store, and a flood of wrong tokens costs it one exchange a period, on
//! one pooled connection, whatever the flood's size. An address that
//! gives wrong tokens to several nodes at once gets at most
//! [`FREE_FAILURES`](super::FREE_FAILURES) free tries from each before the
//! next exchange makes it wait on all of them.

use std::time::Duration;

use estafeta_postgres::{PgAuthFailures, Reported};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::AuthThrottle;

/// How often a node swaps its counts with the cluster's.
pub const EXCHANGE_EVERY: Duration = Duration::from_secs(1);

/// Swaps the counts of `throttle` with the cluster's in `store` every
/// [`EXCHANGE_EVERY`] until `stop` (what was counted since the last
/// exchange then is not reported: a second's counts, which the other
/// nodes' own throttles cover). A report that fails goes with the next
/// one; a store out of reach is logged once when it goes and once when it
/// is back.
pub async fn exchange_counts(
    throttle: &AuthThrottle,
    store: &PgAuthFailures,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(EXCHANGE_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut version = 0;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let taken = throttle.take_reports();
        let now = Instant::now();
        let reported: Vec<Reported> = taken
            .iter()
            .map(|(client, r)| Reported {
                client: *client,
                reset: r.reset,
                failures: r.failures,
                age: now.saturating_duration_since(r.last),
            })
            .collect();
        let exchanged = tokio::select! {
            exchanged = store.exchange(&reported, version) => exchanged,
            _ = stop.cancelled() => return,
        };
        match exchanged {
            Ok(learned) => {
                version = learned.version;
                throttle.learn(&learned.known, Instant::now());
                if std::mem::take(&mut failing) {
                    tracing::info!("wrong tokens are shared with the cluster's other nodes again");
                }
            }
            Err(e) => {
                throttle.put_back(taken);
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(
                        error = %e,
                        "sharing wrong tokens with the cluster's other nodes failed; each node throttles on its own counts until it works again"
                    );
                }
            }
        }
    }
}
