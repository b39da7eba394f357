//! [`AuthThrottle`]: failed authentications (wrong bearer tokens, wrong
//! dashboard logins) counted per client address, so that an address that
//! keeps giving wrong tokens waits longer and longer between tries, and
//! counted in aggregate for the log ([`AuthThrottle::take_summary`]: one
//! line a minute, never one per failure) and the metrics
//! ([`AuthThrottle::figures`]).
//!
//! Changing addresses does not reset it: an address with failures is
//! remembered until [`FORGET_AFTER`] has passed since its last one, never
//! pushed out by others; once [`MAX_ADDRESSES`] are remembered, every new
//! address shares one more entry, throttled like a single address. It does
//! not lock the operator out: an address that logged in with the admin
//! token keeps an entry of its own (up to [`MAX_OPERATORS`] of them), and
//! behind a load balancer the client's own address is used (the
//! `trusted_proxies` setting, [`crate::client_addr`]).
//!
//! In a cluster the counts hold across nodes ([`shared`]): each request
//! still looks only at this node's memory, and the nodes swap what they
//! counted (the addresses with an entry of their own) through the cluster
//! store every [`shared::EXCHANGE_EVERY`].

pub mod shared;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Wrong tokens a client address may give before it must wait.
pub const FREE_FAILURES: u32 = 3;
/// The wait after the first failure past [`FREE_FAILURES`]; it doubles
/// with each further failure.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// An address with no failure for this long starts afresh.
pub const FORGET_AFTER: Duration = Duration::from_secs(60 * 60);
/// The most addresses with an entry of their own; every further one shares
/// one entry.
pub const MAX_ADDRESSES: usize = 10_000;
/// The most addresses remembered as the operator's (logged in with the
/// admin token), which always get an entry of their own.
pub const MAX_OPERATORS: usize = 64;

/// The wait that `failures` wrong tokens in a row impose before the next
/// try: none for the first [`FREE_FAILURES`], then [`FIRST_DELAY`]
/// doubling up to [`MAX_DELAY`].
pub fn delay_after(failures: u32) -> Duration {
    match failures.checked_sub(FREE_FAILURES) {
        None => Duration::ZERO,
        Some(extra) => FIRST_DELAY
            .saturating_mul(2u32.saturating_pow(extra))
            .min(MAX_DELAY),
    }
}

/// Where a wrong token was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// An `Authorization: Bearer` header of the API.
    Bearer,
    /// The dashboard's login form.
    Dashboard,
}

impl Via {
    /// The name, as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Bearer => "bearer",
            Via::Dashboard => "dashboard",
        }
    }
}

/// Failed authentications by client address (an IPv6 client by its /64,
/// the block one host usually has).
pub struct AuthThrottle {
    state: Mutex<State>,
    /// In a cluster, the store the nodes swap their counts through.
    shared: Option<estafeta_postgres::PgAuthFailures>,
}

impl Default for AuthThrottle {
    /// A throttle of this node alone.
    fn default() -> Self {
        AuthThrottle::new(None)
    }
}

#[derive(Default)]
struct State {
    /// The addresses with an entry of their own.
    map: HashMap<IpAddr, Failures>,
    /// The entry every address past [`MAX_ADDRESSES`] shares.
    overflow: Option<Failures>,
    /// Addresses that logged in with the admin token, oldest first.
    operators: VecDeque<IpAddr>,
    /// What happened since the last summary.
    summary: Summary,
    /// The addresses that failed since the last summary (at most
    /// [`MAX_ADDRESSES`] counted).
    failing: HashSet<IpAddr>,
    /// In a cluster, what changed since the last report, for the
    /// addresses with an entry of their own.
    reports: HashMap<IpAddr, Report>,
    /// Since the start, for the metrics.
    totals: Totals,
}

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Failures {
    /// How long it must still wait at `now`.
    fn wait(&self, now: Instant) -> Option<Duration> {
        let until = self.last + delay_after(self.count);
        (until > now).then(|| until - now)
    }

    fn forgotten(&self, now: Instant) -> bool {
        now.duration_since(self.last) >= FORGET_AFTER
    }
}

/// What changed for one address since the last report to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Report {
    /// It gave the admin token (before `failures`).
    reset: bool,
    /// Wrong tokens.
    failures: u32,
    /// When the last of them was.
    last: Instant,
}

/// Failed authentications since the last summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Wrong tokens given.
    pub failures: u64,
    /// Tries answered 429 without being looked at.
    pub throttled: u64,
    /// Distinct client addresses that failed (counted up to
    /// [`MAX_ADDRESSES`]).
    pub addresses: u64,
}

/// Failed authentications since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Wrong bearer tokens.
    pub bearer: u64,
    /// Wrong dashboard logins.
    pub dashboard: u64,
    /// Tries answered 429 without being looked at.
    pub throttled: u64,
}

/// The throttle's figures for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Since the start.
    pub totals: Totals,
    /// Addresses with wrong tokens not yet forgotten (in a cluster, those
    /// of every node this node heard of).
    pub addresses: u64,
}

/// The key of a client address: IPv4 as it is (also when mapped into
/// IPv6), IPv6 by its /64 prefix.
fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

impl State {
    /// The entry `key` counts in, if it has failed: its own, or the shared
    /// one when it has none and the map is full.
    fn entry(&self, key: IpAddr) -> Option<&Failures> {
        match self.map.get(&key) {
            Some(f) => Some(f),
            None if self.map.len() >= MAX_ADDRESSES && !self.operators.contains(&key) => {
                self.overflow.as_ref()
            }
            None => None,
        }
    }

    /// Whether `key` has, or may have, an entry of its own; making room by
    /// dropping the entries forgotten at `now` when the map is full.
    fn own(&mut self, key: IpAddr, now: Instant) -> bool {
        if !self.map.contains_key(&key) && self.map.len() >= MAX_ADDRESSES {
            self.map.retain(|_, f| !f.forgotten(now));
        }
        self.map.contains_key(&key)
            || self.map.len() < MAX_ADDRESSES
            || self.operators.contains(&key)
    }
}

impl AuthThrottle {
    /// A throttle whose counts, in a cluster, are swapped with the other
    /// nodes' through `shared` (run by [`run`]).
    pub fn new(shared: Option<estafeta_postgres::PgAuthFailures>) -> Self {
        AuthThrottle {
            state: Mutex::default(),
            shared,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long `addr` must still wait at `now` before a token it gives is
    /// looked at (`None`: it may try now). A try refused for that is
    /// counted in the summary.
    pub fn wait(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let mut state = self.state();
        let wait = state.entry(client_key(addr))?.wait(now);
        if wait.is_some() {
            state.summary.throttled += 1;
            state.totals.throttled += 1;
        }
        wait
    }

    /// `addr` gave a wrong token at `now`, `via` the API or the dashboard.
    pub fn failed(&self, addr: IpAddr, now: Instant, via: Via) {
        let key = client_key(addr);
        let mut state = self.state();
        state.summary.failures += 1;
        match via {
            Via::Bearer => state.totals.bearer += 1,
            Via::Dashboard => state.totals.dashboard += 1,
        }
        if state.failing.len() < MAX_ADDRESSES && state.failing.insert(key) {
            state.summary.addresses += 1;
        }
        let own = state.own(key, now);
        let blank = Failures {
            count: 0,
            last: now,
        };
        let entry = match own {
            true => state.map.entry(key).or_insert(blank),
            false => state.overflow.get_or_insert(blank),
        };
        if entry.forgotten(now) {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        if own && self.shared.is_some() {
            let report = state.reports.entry(key).or_insert(Report {
                reset: false,
                failures: 0,
                last: now,
            });
            report.failures = report.failures.saturating_add(1);
            report.last = now;
        }
    }

    /// `addr` gave the admin token at `now`: it starts afresh, and is
    /// remembered as the operator's.
    pub fn succeeded(&self, addr: IpAddr, now: Instant) {
        let key = client_key(addr);
        let mut state = self.state();
        state.map.remove(&key);
        state.operators.retain(|a| *a != key);
        if state.operators.len() >= MAX_OPERATORS {
            state.operators.pop_front();
        }
        state.operators.push_back(key);
        if self.shared.is_some() {
            state.reports.insert(
                key,
                Report {
                    reset: true,
                    failures: 0,
                    last: now,
                },
            );
        }
    }

    /// What happened since the last call.
    pub fn take_summary(&self) -> Summary {
        let mut state = self.state();
        state.failing.clear();
        std::mem::take(&mut state.summary)
    }

    /// The figures of the metrics at `now`.
    pub fn figures(&self, now: Instant) -> Figures {
        let state = self.state();
        let remembered = |f: &Failures| f.count > 0 && !f.forgotten(now);
        let own = state.map.values().filter(|f| remembered(f)).count();
        let overflow = state.overflow.as_ref().is_some_and(remembered);
        Figures {
            totals: state.totals,
            addresses: (own + usize::from(overflow)) as u64,
        }
    }

    /// What changed since the last report, taken out to be reported.
    fn take_reports(&self) -> HashMap<IpAddr, Report> {
        std::mem::take(&mut self.state().reports)
    }

    /// Reports that could not be made, put back to go with the next (a
    /// later admin token of an address supersedes its earlier failures).
    fn put_back(&self, unreported: HashMap<IpAddr, Report>) {
        let mut state = self.state();
        for (key, old) in unreported {
            match state.reports.get_mut(&key) {
                None => {
                    state.reports.insert(key, old);
                }
                Some(new) if new.reset => {}
                Some(new) => {
                    new.reset = old.reset;
                    new.failures = new.failures.saturating_add(old.failures);
                }
            }
        }
    }

    /// The cluster's counts `known` at `now`, each with what this node
    /// counted since it took its last report.
    fn learn(&self, known: &[estafeta_postgres::Known], now: Instant) {
        let mut state = self.state();
        for k in known {
            if k.age >= FORGET_AFTER {
                continue;
            }
            let key = client_key(k.client);
            let theirs = now.checked_sub(k.age).unwrap_or(now);
            let (count, last) = match state.reports.get(&key) {
                Some(r) if r.reset => (r.failures, r.last),
                Some(r) => (k.failures.saturating_add(r.failures), r.last.max(theirs)),
                None => (k.failures, theirs),
            };
            if count == 0 {
                state.map.remove(&key);
                continue;
            }
            let learned = Failures { count, last };
            if state.own(key, now) {
                state.map.insert(key, learned);
            } else {
                let overflow = state.overflow.get_or_insert(learned);
                overflow.count = overflow.count.max(count);
                overflow.last = overflow.last.max(last);
            }
        }
    }
}

/// How often wrong tokens are logged, in aggregate.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// The throttle's background work until `stop`: the summaries
/// ([`log_summaries`]) and, in a cluster, the swap of counts with the
/// other nodes ([`shared::exchange_counts`]).
pub async fn run(throttle: &AuthThrottle, stop: tokio_util::sync::CancellationToken) {
    match &throttle.shared {
        Some(store) => {
            tokio::join!(
                log_summaries(throttle, stop.clone()),
                shared::exchange_counts(throttle, store, stop)
            );
        }
        None => log_summaries(throttle, stop).await,
    }
}

/// Logs what `throttle` counted every [`SUMMARY_EVERY`] (one line to the
/// event log when anything happened), until `stop`, and once more then.
pub async fn log_summaries(throttle: &AuthThrottle, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(SUMMARY_EVERY);
    tick.tick().await;
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        let Summary {
            failures,
            throttled,
            addresses,
        } = throttle.take_summary();
        if failures > 0 || throttled > 0 {
            tracing::warn!(
                target: "estafeta::event",
                failures,
                addresses,
                throttled,
                "wrong tokens (bearer and dashboard logins) since the last summary; throttled tries were answered 429 unlooked-at"
            );
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_grows_with_each_failure_up_to_a_bound() {
        let waits: Vec<u64> = (0..8).map(|n| delay_after(n).as_secs()).collect();
        assert_eq!(waits, [0, 0, 0, 1, 2, 4, 8, 16]);
        assert_eq!(delay_after(30), MAX_DELAY);
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn failures_throttle_their_address_until_the_wait_is_over() {
        let t = AuthThrottle::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(t.wait(a, t0), None);
            t.failed(a, t0, Via::Bearer);
        }
        assert_eq!(t.wait(a, t0), Some(FIRST_DELAY));
        assert_eq!(t.wait(b, t0), None, "another address is not affected");
        let t1 = t0 + FIRST_DELAY;
        assert_eq!(t.wait(a, t1), None);
        t.failed(a, t1, Via::Bearer);
        assert_eq!(t.wait(a, t1), Some(2 * FIRST_DELAY), "the wait doubles");
        t.succeeded(a, t1);
        assert_eq!(t.wait(a, t1), None, "a login starts afresh");

        // The same client over IPv4 mapped into IPv6, and one IPv6 host's /64.
        let mapped: IpAddr = "::ffff:192.0.2.3".parse().unwrap();
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            t.failed(mapped, t1, Via::Bearer);
            t.failed(v6a, t1, Via::Dashboard);
        }
        assert!(t.wait("192.0.2.3".parse().unwrap(), t1).is_some());
        assert!(t.wait(v6b, t1).is_some());
        assert_eq!(t.wait("2001:db8:1:3::1".parse().unwrap(), t1), None);

        // Old failures are forgotten.
        let later = t1 + FORGET_AFTER;
        t.failed(v6a, later, Via::Bearer);
        assert_eq!(t.wait(v6a, later), None);
        let summary = t.take_summary();
        assert_eq!(summary.failures, 11);
        assert_eq!(summary.addresses, 3);
        assert_eq!(summary.throttled, 4);
        assert_eq!(t.take_summary(), Summary::default());
        let figures = t.figures(later);
        let totals = Totals {
            bearer: 8,
            dashboard: 3,
            throttled: 4,
        };
        assert_eq!(figures.totals, totals, "the totals are not reset");
        assert_eq!(figures.addresses, 1, "the others are forgotten by now");
    }

    /// A throttle of a cluster's node (no connection is made).
    fn clustered() -> AuthThrottle {
        let store = estafeta_postgres::Store::connect("postgres://nobody@localhost/none").unwrap();
        AuthThrottle::new(Some(estafeta_postgres::PgAuthFailures::new(
            store,
            FORGET_AFTER,
        )))
    }

    #[test]
    fn a_node_reports_what_it_counted_and_learns_what_every_node_counted() {
        use estafeta_postgres::Known;
        let t = clustered();
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "192.0.2.1".parse().unwrap(),
            "192.0.2.2".parse().unwrap(),
            "192.0.2.3".parse().unwrap(),
        );
        let t0 = Instant::now();
        t.failed(a, t0, Via::Bearer);
        t.failed(a, t0, Via::Dashboard);
        t.succeeded(b, t0);
        t.failed(b, t0, Via::Bearer);
        let taken = t.take_reports();
        let report = |reset, failures| Report {
            reset,
            failures,
            last: t0,
        };
        assert_eq!(taken[&a], report(false, 2));
        assert_eq!(taken[&b], report(true, 1));
        assert!(t.take_reports().is_empty());

        // One more failure of `a` while the report is on its way; the
        // cluster's counts include the report and another node's failures.
        let t1 = t0 + Duration::from_millis(10);
        t.failed(a, t1, Via::Bearer);
        let known = |client, failures| Known {
            client,
            failures,
            age: Duration::ZERO,
        };
        t.learn(&[known(a, 5), known(b, 1), known(c, 4)], t1);
        assert_eq!(t.wait(a, t1), Some(delay_after(6)), "5 and 1 since");
        assert_eq!(t.wait(b, t1), None);
        assert_eq!(t.wait(c, t1), Some(delay_after(4)), "failed elsewhere only");
        assert_eq!(t.figures(t1).addresses, 3);

        // A report that could not be made goes with the next one; an admin
        // token given since supersedes it.
        t.put_back(taken);
        let again = t.take_reports();
        assert_eq!(again[&a].failures, 3);
        assert_eq!(again[&b], report(true, 1));
        t.succeeded(a, t1);
        t.put_back(again);
        let last = t.take_reports();
        assert!(last[&a].reset && last[&a].failures == 0, "{:?}", last[&a]);

        // Another node's admin token from `c` frees it here too.
        t.learn(&[known(c, 0)], t1);
        assert_eq!(t.wait(c, t1), None);
    }

    #[test]
    fn a_node_alone_reports_nothing() {
        let t = AuthThrottle::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        t.failed(a, Instant::now(), Via::Bearer);
        assert!(t.take_reports().is_empty());
    }

    #[test]
    fn new_addresses_do_not_free_a_locked_one_and_the_operator_keeps_its_own_entry() {
        let t = AuthThrottle::default();
        let t0 = Instant::now();
        let addr = |i: usize| IpAddr::from((i as u32 + 1).to_be_bytes());
        let locked = addr(0);
        let operator: IpAddr = "198.51.100.7".parse().unwrap();
        t.succeeded(operator, t0);
        for _ in 0..=FREE_FAILURES {
            t.failed(locked, t0, Via::Bearer);
        }
        for i in 1..MAX_ADDRESSES + 10 {
            t.failed(addr(i), t0, Via::Bearer);
        }
        assert!(t.wait(locked, t0).is_some(), "still locked");
        // Past the map's room, the newcomers share one throttled entry.
        assert!(t.wait(addr(MAX_ADDRESSES + 20), t0).is_some());
        assert_eq!(t.wait(operator, t0), None, "the operator is not locked out");
        t.failed(operator, t0, Via::Bearer);
        assert_eq!(t.wait(operator, t0), None, "its own entry, one failure");
        let map = &t.state.lock().unwrap().map;
        assert_eq!(map.len(), MAX_ADDRESSES + 1);
    }
}
