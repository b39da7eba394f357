//! The times the harness itself held PostgreSQL, or a database's lock in
//! it, out of the nodes' reach: a fault fired between them
//! ([`crate::proxy`]), a failover, a node it stalled inside a step
//! ([`crate::server`]; PostgreSQL frees that node's locks at the hold
//! limit). A node that starts meanwhile waits for its store, or for the
//! lock of a database its start-up processing loads, and that wait is the
//! harness's doing: a start's own time, held to the bound, is its time to
//! `/readyz` less what these cover of it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a node may still wait after the store came back before it
/// tries again: the server's longest pause between two tries to open its
/// store.
const NODE_RETRY: Duration = Duration::from_secs(5);

/// The outages so far (a clone is a handle on the same list).
#[derive(Clone, Debug, Default)]
pub(crate) struct Outages(Arc<Mutex<Vec<(Instant, Instant)>>>);

impl Outages {
    /// The store was out of reach from `from` for `length`; a node's
    /// pause before its next try counts too.
    pub(crate) fn record(&self, from: Instant, length: Duration) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.push((from, from + length + NODE_RETRY));
    }

    /// How much of `[from, to]` the outages cover.
    pub(crate) fn within(&self, from: Instant, to: Instant) -> Duration {
        let list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut spans: Vec<(Instant, Instant)> = list
            .iter()
            .map(|&(a, b)| (a.max(from), b.min(to)))
            .filter(|(a, b)| a < b)
            .collect();
        spans.sort();
        let mut covered = Duration::ZERO;
        let mut reached = from;
        for (a, b) in spans {
            let a = a.max(reached);
            if b > a {
                covered += b - a;
                reached = b;
            }
        }
        covered
    }

    /// The time of `[from, now]` the outages do not cover.
    pub(crate) fn own_time(&self, from: Instant) -> Duration {
        let now = Instant::now();
        (now - from).saturating_sub(self.within(from, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_outages_count_once_and_only_inside_the_span() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let outages = Outages::default();
        // [1, 8] and [3, 10] with the retry pause: [1, 10] once.
        outages.record(t0 + s(1), s(2));
        outages.record(t0 + s(3), s(2));
        assert_eq!(outages.within(t0, t0 + s(20)), s(9));
        assert_eq!(outages.within(t0 + s(4), t0 + s(6)), s(2));
        assert_eq!(outages.within(t0 + s(11), t0 + s(20)), Duration::ZERO);
    }
}
