//! [`AuthThrottle`]: failed authentications (wrong bearer tokens, wrong
//! dashboard logins) counted per client address, so that an address that
//! keeps giving wrong tokens waits longer and longer between tries, and
//! counted in aggregate for the log ([`AuthThrottle::take_summary`]: one
//! line a minute, never one per failure).
//!
//! Changing addresses does not reset it: an address with failures is
//! remembered until [`FORGET_AFTER`] has passed since its last one, never
//! pushed out by others; once [`MAX_ADDRESSES`] are remembered, every new
//! address shares one more entry, throttled like a single address. It does
//! not lock the operator out: an address that logged in with the admin
//! token keeps an entry of its own (up to [`MAX_OPERATORS`] of them), and
//! behind a load balancer the client's own address is used (the
//! `trusted_proxies` setting, [`crate::client_addr`]).

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

/// Failed authentications by client address (an IPv6 client by its /64,
/// the block one host usually has).
#[derive(Default)]
pub struct AuthThrottle {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The addresses with an entry of their own.
    map: HashMap<IpAddr, Failures>,
    /// The entry every address past [`MAX_ADDRESSES`] shares.
    shared: Option<Failures>,
    /// Addresses that logged in with the admin token, oldest first.
    operators: VecDeque<IpAddr>,
    /// What happened since the last summary.
    summary: Summary,
    /// The addresses that failed since the last summary (at most
    /// [`MAX_ADDRESSES`] counted).
    failing: HashSet<IpAddr>,
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
                self.shared.as_ref()
            }
            None => None,
        }
    }
}

impl AuthThrottle {
    /// How long `addr` must still wait at `now` before a token it gives is
    /// looked at (`None`: it may try now). A try refused for that is
    /// counted in the summary.
    pub fn wait(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let wait = state.entry(client_key(addr))?.wait(now);
        if wait.is_some() {
            state.summary.throttled += 1;
        }
        wait
    }

    /// `addr` gave a wrong token at `now`.
    pub fn failed(&self, addr: IpAddr, now: Instant) {
        let key = client_key(addr);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.summary.failures += 1;
        if state.failing.len() < MAX_ADDRESSES && state.failing.insert(key) {
            state.summary.addresses += 1;
        }
        if !state.map.contains_key(&key) && state.map.len() >= MAX_ADDRESSES {
            state.map.retain(|_, f| !f.forgotten(now));
        }
        let own = state.map.contains_key(&key)
            || state.map.len() < MAX_ADDRESSES
            || state.operators.contains(&key);
        let entry = match own {
            true => state.map.entry(key).or_insert(Failures {
                count: 0,
                last: now,
            }),
            false => state.shared.get_or_insert(Failures {
                count: 0,
                last: now,
            }),
        };
        if entry.forgotten(now) {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
    }

    /// `addr` gave the admin token: it starts afresh, and is remembered as
    /// the operator's.
    pub fn succeeded(&self, addr: IpAddr) {
        let key = client_key(addr);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.map.remove(&key);
        state.operators.retain(|a| *a != key);
        if state.operators.len() >= MAX_OPERATORS {
            state.operators.pop_front();
        }
        state.operators.push_back(key);
    }

    /// What happened since the last call.
    pub fn take_summary(&self) -> Summary {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.failing.clear();
        std::mem::take(&mut state.summary)
    }
}

/// How often wrong tokens are logged, in aggregate.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

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
            t.failed(a, t0);
        }
        assert_eq!(t.wait(a, t0), Some(FIRST_DELAY));
        assert_eq!(t.wait(b, t0), None, "another address is not affected");
        let t1 = t0 + FIRST_DELAY;
        assert_eq!(t.wait(a, t1), None);
        t.failed(a, t1);
        assert_eq!(t.wait(a, t1), Some(2 * FIRST_DELAY), "the wait doubles");
        t.succeeded(a);
        assert_eq!(t.wait(a, t1), None, "a login starts afresh");

        // The same client over IPv4 mapped into IPv6, and one IPv6 host's /64.
        let mapped: IpAddr = "::ffff:192.0.2.3".parse().unwrap();
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            t.failed(mapped, t1);
            t.failed(v6a, t1);
        }
        assert!(t.wait("192.0.2.3".parse().unwrap(), t1).is_some());
        assert!(t.wait(v6b, t1).is_some());
        assert_eq!(t.wait("2001:db8:1:3::1".parse().unwrap(), t1), None);

        // Old failures are forgotten.
        let later = t1 + FORGET_AFTER;
        t.failed(v6a, later);
        assert_eq!(t.wait(v6a, later), None);
        let summary = t.take_summary();
        assert_eq!(summary.failures, 11);
        assert_eq!(summary.addresses, 3);
        assert_eq!(summary.throttled, 4);
        assert_eq!(t.take_summary(), Summary::default());
    }

    #[test]
    fn new_addresses_do_not_free_a_locked_one_and_the_operator_keeps_its_own_entry() {
        let t = AuthThrottle::default();
        let t0 = Instant::now();
        let addr = |i: usize| IpAddr::from((i as u32 + 1).to_be_bytes());
        let locked = addr(0);
        let operator: IpAddr = "198.51.100.7".parse().unwrap();
        t.succeeded(operator);
        for _ in 0..=FREE_FAILURES {
            t.failed(locked, t0);
        }
        for i in 1..MAX_ADDRESSES + 10 {
            t.failed(addr(i), t0);
        }
        assert!(t.wait(locked, t0).is_some(), "still locked");
        // Past the map's room, the newcomers share one throttled entry.
        assert!(t.wait(addr(MAX_ADDRESSES + 20), t0).is_some());
        assert_eq!(t.wait(operator, t0), None, "the operator is not locked out");
        t.failed(operator, t0);
        assert_eq!(t.wait(operator, t0), None, "its own entry, one failure");
        let map = &t.state.lock().unwrap().map;
        assert_eq!(map.len(), MAX_ADDRESSES + 1);
    }
}
